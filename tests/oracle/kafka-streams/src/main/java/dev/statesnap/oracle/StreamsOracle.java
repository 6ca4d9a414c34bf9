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
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * Kafka Streams as the oracle of statesnap's aggregations: the operators statesnap names after
 * Kafka Streams', written as a Kafka Streams user writes them, over one input topic (String keys,
 * JSON values such as {@code {"amount": 5}}), every update sent to an output topic
 * {@code PREFIX-<operator>} (the record cache is off, so each input record's update is emitted):
 *
 * <ul>
 *   <li>{@code count}: {@code groupByKey().count()};
 *   <li>{@code sum}: {@code groupByKey().aggregate(() -> 0, (k, v, a) -> a + amount(v))};
 *   <li>{@code max}: {@code mapValues(amount).groupByKey().reduce(Math::max)};
 *   <li>{@code tumbling}, {@code hopping}: {@code windowedBy(TimeWindows.ofSizeAndGrace(SIZE,
 *       GRACE)[.advanceBy(ADVANCE)]).count()}, keys {@code key@windowStart};
 *   <li>{@code tumbling-final}: the tumbling count through {@code
 *       suppress(untilWindowCloses(unbounded()))}: one final result per window.
 * </ul>
 *
 * <p>Values are the aggregate as decimal text. Exits once every input record up to the end offsets
 * seen at start has been processed (a probe processor, added last, records each one), after a
 * clean close (the producer flushed). Prints one JSON line on stdout; logs go to stderr.
 *
 * <p>Usage: {@code StreamsOracle BOOTSTRAP INPUT PREFIX APP_ID STATE_DIR TIMEOUT_S SIZE_MS GRACE_MS
 * ADVANCE_MS}
 */
public final class StreamsOracle {
  private static final Pattern AMOUNT = Pattern.compile("\"amount\"\\s*:\\s*(-?\\d+)");

  /** Highest processed offset + 1 per input partition, written by the stream thread. */
  private static final Map<Integer, Long> PROCESSED = new ConcurrentHashMap<>();

  private StreamsOracle() {}

  static Long amount(String value) {
    if (value == null) {
      return null;
    }
    Matcher m = AMOUNT.matcher(value);
    return m.find() ? Long.valueOf(m.group(1)) : null;
  }

  /** Records each input record's position; forwards nothing. */
  static final class Probe implements FixedKeyProcessor<String, String, String> {
    private FixedKeyProcessorContext<String, String> context;

    @Override
    public void init(FixedKeyProcessorContext<String, String> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<String, String> record) {
      context
          .recordMetadata()
          .ifPresent(m -> PROCESSED.merge(m.partition(), m.offset() + 1, Math::max));
    }
  }

  private static void sendTable(KTable<String, Long> table, String topic) {
    table
        .toStream()
        .mapValues(v -> v == null ? null : v.toString())
        .to(topic, Produced.with(Serdes.String(), Serdes.String()));
  }

  private static void sendWindows(KTable<Windowed<String>, Long> table, String topic) {
    table
        .toStream()
        .map((w, v) -> KeyValue.pair(w.key() + "@" + w.window().start(), v == null ? null : v.toString()))
        .to(topic, Produced.with(Serdes.String(), Serdes.String()));
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 9) {
      System.err.println(
          "usage: StreamsOracle BOOTSTRAP INPUT PREFIX APP_ID STATE_DIR TIMEOUT_S SIZE_MS GRACE_MS ADVANCE_MS");
      System.exit(2);
    }
    String bootstrap = args[0];
    String input = args[1];
    String prefix = args[2];
    String appId = args[3];
    Path stateDir = Path.of(args[4]);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[5]));
    Duration size = Duration.ofMillis(Long.parseLong(args[6]));
    Duration grace = Duration.ofMillis(Long.parseLong(args[7]));
    Duration advance = Duration.ofMillis(Long.parseLong(args[8]));
    wipe(stateDir);
    Files.createDirectories(stateDir);

    StreamsBuilder builder = new StreamsBuilder();
    KStream<String, String> in = builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
    KGroupedStream<String, String> grouped = in.groupByKey();
    sendTable(grouped.count(Materialized.as("count")), prefix + "-count");
    sendTable(
        grouped.aggregate(
            () -> 0L,
            (k, v, total) -> total + amount(v),
            Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("sum")
                .withValueSerde(Serdes.Long())),
        prefix + "-sum");
    sendTable(
        in.mapValues(StreamsOracle::amount)
            .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()))
            .reduce(Math::max, Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("max")),
        prefix + "-max");
    TimeWindows tumbling = TimeWindows.ofSizeAndGrace(size, grace);
    KTable<Windowed<String>, Long> tumblingCount =
        grouped.windowedBy(tumbling).count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>as("tumbling"));
    sendWindows(tumblingCount, prefix + "-tumbling");
    sendWindows(
        tumblingCount.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded())),
        prefix + "-tumbling-final");
    sendWindows(
        grouped
            .windowedBy(tumbling.advanceBy(advance))
            .count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>as("hopping")),
        prefix + "-hopping");
    in.processValues(Probe::new); // last: a record is probed once every operator has seen it

    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0); // every update is emitted
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

    Map<Integer, Long> ends;
    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(adminProps)) {
      ends = endOffsets(admin, input);
    }
    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    streams.start();
    try {
      while (!done(ends)) {
        if (streams.state() == KafkaStreams.State.ERROR || streams.state() == KafkaStreams.State.NOT_RUNNING) {
          System.err.println("oracle: Kafka Streams stopped in state " + streams.state());
          System.exit(1);
        }
        if (System.nanoTime() > deadline) {
          System.err.println("oracle: input not processed in time: processed " + PROCESSED + " of " + ends);
          System.exit(1);
        }
        Thread.sleep(20);
      }
    } finally {
      streams.close(Duration.ofSeconds(30));
    }
    long records = ends.values().stream().mapToLong(Long::longValue).sum();
    System.out.println("{\"processed\": " + records + "}");
  }

  private static boolean done(Map<Integer, Long> ends) {
    for (Map.Entry<Integer, Long> end : ends.entrySet()) {
      if (end.getValue() > 0 && PROCESSED.getOrDefault(end.getKey(), 0L) < end.getValue()) {
        return false;
      }
    }
    return true;
  }

  private static Map<Integer, Long> endOffsets(Admin admin, String topic) throws Exception {
    TopicDescription description =
        admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS).get(topic);
    Map<TopicPartition, OffsetSpec> request = new HashMap<>();
    description.partitions().forEach(p -> request.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest()));
    Map<Integer, Long> ends = new HashMap<>();
    admin
        .listOffsets(request)
        .all()
        .get(30, TimeUnit.SECONDS)
        .forEach((tp, info) -> ends.put(tp.partition(), info.offset()));
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
