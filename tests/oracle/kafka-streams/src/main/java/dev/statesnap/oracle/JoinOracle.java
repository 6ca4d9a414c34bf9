package dev.statesnap.oracle;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.Joined;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.state.BuiltInDslStoreSuppliers;

/**
 * Kafka Streams as the oracle of statesnap's joins, written as a Kafka Streams user writes them,
 * over three co-partitioned topics (String keys, JSON text values): LEFT and RIGHT streams and a
 * TABLE topic. Every result goes to {@code PREFIX-<join>}:
 *
 * <ul>
 *   <li>{@code inner}, {@code left}, {@code outer}: {@code left.join/leftJoin/outerJoin(right,
 *       joiner, JoinWindows.ofTimeDifferenceAndGrace(AFTER, GRACE).before(BEFORE))};
 *   <li>{@code table-inner}, {@code table-left}: {@code left.join/leftJoin(builder.table(TABLE),
 *       joiner)}.
 * </ul>
 *
 * <p>The joiner makes {@code {"left": L, "right": R}} of the two JSON texts ({@code null} for a
 * missing side), statesnap's default joined value. Stores are in memory (their retention is exact
 * to the millisecond; RocksDB's drops by segment), the record cache is off, and unmatched
 * left/outer records are checked for at every record (the internal emit interval, 1 s of wall
 * clock by default, set to 0 so the results do not depend on timing). Exits once the
 * application's committed offsets reach the end offsets seen at start on all three topics, after
 * a clean close. Prints one JSON line on stdout; logs go to stderr.
 *
 * <p>Usage: {@code JoinOracle BOOTSTRAP LEFT RIGHT TABLE PREFIX APP_ID STATE_DIR TIMEOUT_S
 * BEFORE_MS AFTER_MS GRACE_MS}
 */
public final class JoinOracle {
  /** Kafka Streams' internal setting of how often unmatched records are looked for (ms). */
  private static final String EMIT_INTERVAL = "__emit.interval.ms.kstreams.outer.join.spurious.results.fix__";

  private JoinOracle() {}

  static String joined(String left, String right) {
    return "{\"left\": " + (left == null ? "null" : left) + ", \"right\": " + (right == null ? "null" : right) + "}";
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 11) {
      System.err.println(
          "usage: JoinOracle BOOTSTRAP LEFT RIGHT TABLE PREFIX APP_ID STATE_DIR TIMEOUT_S BEFORE_MS AFTER_MS GRACE_MS");
      System.exit(2);
    }
    String bootstrap = args[0];
    String leftTopic = args[1];
    String rightTopic = args[2];
    String tableTopic = args[3];
    String prefix = args[4];
    String appId = args[5];
    Path stateDir = Path.of(args[6]);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[7]));
    Duration before = Duration.ofMillis(Long.parseLong(args[8]));
    Duration after = Duration.ofMillis(Long.parseLong(args[9]));
    Duration grace = Duration.ofMillis(Long.parseLong(args[10]));
    wipe(stateDir);
    Files.createDirectories(stateDir);

    StreamsBuilder builder = new StreamsBuilder();
    Consumed<String, String> strings = Consumed.with(Serdes.String(), Serdes.String());
    KStream<String, String> left = builder.stream(leftTopic, strings);
    KStream<String, String> right = builder.stream(rightTopic, strings);
    KTable<String, String> table = builder.table(tableTopic, strings);
    JoinWindows window = JoinWindows.ofTimeDifferenceAndGrace(after, grace).before(before);
    StreamJoined<String, String, String> joinedWith =
        StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String());
    Produced<String, String> out = Produced.with(Serdes.String(), Serdes.String());
    left.join(right, JoinOracle::joined, window, joinedWith.withName("inner").withStoreName("inner"))
        .to(prefix + "-inner", out);
    left.leftJoin(right, JoinOracle::joined, window, joinedWith.withName("left").withStoreName("left"))
        .to(prefix + "-left", out);
    left.outerJoin(right, JoinOracle::joined, window, joinedWith.withName("outer").withStoreName("outer"))
        .to(prefix + "-outer", out);
    Joined<String, String, String> tableJoined = Joined.with(Serdes.String(), Serdes.String(), Serdes.String());
    left.join(table, JoinOracle::joined, tableJoined.withName("table-inner")).to(prefix + "-table-inner", out);
    left.leftJoin(table, JoinOracle::joined, tableJoined.withName("table-left")).to(prefix + "-table-left", out);

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
    props.put(StreamsConfig.DSL_STORE_SUPPLIERS_CLASS_CONFIG, BuiltInDslStoreSuppliers.InMemoryDslStoreSuppliers.class);
    props.put(EMIT_INTERVAL, 0L);
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(adminProps)) {
      Map<TopicPartition, Long> ends = new HashMap<>();
      for (String topic : List.of(leftTopic, rightTopic, tableTopic)) {
        ends.putAll(endOffsets(admin, topic));
      }
      KafkaStreams streams = new KafkaStreams(builder.build(), props);
      streams.start();
      try {
        while (!done(admin, appId, ends)) {
          if (streams.state() == KafkaStreams.State.ERROR || streams.state() == KafkaStreams.State.NOT_RUNNING) {
            System.err.println("oracle: Kafka Streams stopped in state " + streams.state());
            System.exit(1);
          }
          if (System.nanoTime() > deadline) {
            System.err.println("oracle: input not processed in time (end offsets " + ends + ")");
            System.exit(1);
          }
          Thread.sleep(100);
        }
      } finally {
        streams.close(Duration.ofSeconds(30));
      }
      long records = ends.values().stream().mapToLong(Long::longValue).sum();
      System.out.println("{\"processed\": " + records + "}");
    }
  }

  private static boolean done(Admin admin, String appId, Map<TopicPartition, Long> ends) throws Exception {
    Map<TopicPartition, OffsetAndMetadata> committed =
        admin.listConsumerGroupOffsets(appId).partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
    for (Map.Entry<TopicPartition, Long> end : ends.entrySet()) {
      if (end.getValue() == 0) {
        continue;
      }
      OffsetAndMetadata at = committed.get(end.getKey());
      if (at == null || at.offset() < end.getValue()) {
        return false;
      }
    }
    return true;
  }

  private static Map<TopicPartition, Long> endOffsets(Admin admin, String topic) throws Exception {
    TopicDescription description =
        admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS).get(topic);
    Map<TopicPartition, OffsetSpec> request = new HashMap<>();
    description.partitions().forEach(p -> request.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest()));
    Map<TopicPartition, Long> ends = new HashMap<>();
    admin.listOffsets(request).all().get(30, TimeUnit.SECONDS).forEach((tp, info) -> ends.put(tp, info.offset()));
    return ends;
  }

  private static void wipe(Path dir) throws IOException {
    if (!Files.exists(dir)) {
      return;
    }
    try (Stream<Path> paths = Files.walk(dir)) {
      for (Path p : paths.sorted(Comparator.reverseOrder()).toList()) {
        Files.delete(p);
      }
    }
  }
}
