package dev.statesnap.peers;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;

/**
 * The peer statesnap is measured against: a Kafka Streams app holding the input topic as a table
 * (KStream#toTable, tombstones delete) and, optionally, groupByKey().count(), both in RocksDB
 * with changelog topics, as a user would write it.
 *
 * <p>{@code build}: fresh state dir, consume the whole input, exit once every input record up to
 * the end offsets seen at start has been processed (tracked by a pass-through processor, so no
 * commit interval or lag metric delays the probe), then close (flushes caches into the changelogs).
 *
 * <p>{@code restore}: same application id, state dir wiped: time from start() to RUNNING with all
 * stores restored from their changelogs (StateRestoreListener), then until the input's tail is
 * processed. Prints one JSON line on stdout; everything else goes to stderr.
 *
 * <p>{@code compact}: the changelogs get 1 MB segments, so the broker's cleaner (set to act within
 * seconds by the dev broker) compacts all but their active segment; {@code build} then waits until
 * their size stops shrinking. This is the best case for Kafka Streams: a long-lived changelog that
 * the cleaner has caught up with.
 *
 * <p>Usage: {@code StreamsPeer build|restore BOOTSTRAP TOPIC APP_ID STATE_DIR TIMEOUT_S [count]
 * [compact]}
 */
public final class StreamsPeer {
  private static final String TABLE_STORE = "table";
  private static final String COUNT_STORE = "counts";

  /** Highest processed offset + 1 per input partition, written by the stream thread. */
  private static final Map<Integer, Long> PROCESSED = new ConcurrentHashMap<>();

  private StreamsPeer() {}

  /** Records each input record's position; forwards nothing (a probe, not part of the result). */
  static final class Probe implements FixedKeyProcessor<Bytes, Bytes, Bytes> {
    private FixedKeyProcessorContext<Bytes, Bytes> context;

    @Override
    public void init(FixedKeyProcessorContext<Bytes, Bytes> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<Bytes, Bytes> record) {
      context
          .recordMetadata()
          .ifPresent(m -> PROCESSED.merge(m.partition(), m.offset() + 1, Math::max));
    }
  }

  /** Sums what the restore consumer replays into each store, and when restores start and end. */
  static final class Restores implements StateRestoreListener {
    final Map<String, AtomicLong> records = new ConcurrentHashMap<>();
    final AtomicLong firstStartNanos = new AtomicLong(0);
    final AtomicLong lastEndNanos = new AtomicLong(0);
    final AtomicLong partitionsDone = new AtomicLong(0);

    @Override
    public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
      firstStartNanos.compareAndSet(0, System.nanoTime());
    }

    @Override
    public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}

    @Override
    public void onRestoreEnd(TopicPartition tp, String store, long total) {
      records.computeIfAbsent(store, k -> new AtomicLong()).addAndGet(total);
      lastEndNanos.set(System.nanoTime());
      partitionsDone.incrementAndGet();
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 6 || !(args[0].equals("build") || args[0].equals("restore"))) {
      System.err.println(
          "usage: StreamsPeer build|restore BOOTSTRAP TOPIC APP_ID STATE_DIR TIMEOUT_S [count] [compact]");
      System.exit(2);
    }
    String mode = args[0];
    String bootstrap = args[1];
    String topic = args[2];
    String appId = args[3];
    Path stateDir = Path.of(args[4]);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[5]));
    List<String> flags = List.of(args).subList(6, args.length);
    boolean withCount = flags.contains("count");
    boolean compact = flags.contains("compact");

    wipe(stateDir); // "restore" means the local state is gone: a new host or a lost disk
    Files.createDirectories(stateDir);

    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(adminProps)) {
      Map<Integer, Long> ends = endOffsets(admin, topic);
      // A partition with no tail since the last commit has nothing to process: start the probe at
      // the committed offsets so it does not wait for records that will never come.
      admin
          .listConsumerGroupOffsets(appId)
          .partitionsToOffsetAndMetadata()
          .get(30, TimeUnit.SECONDS)
          .forEach(
              (tp, om) -> {
                if (om != null && tp.topic().equals(topic)) {
                  PROCESSED.put(tp.partition(), om.offset());
                }
              });

      StreamsBuilder builder = new StreamsBuilder();
      KStream<Bytes, Bytes> input =
          builder.stream(topic, Consumed.with(Serdes.Bytes(), Serdes.Bytes()));
      input.processValues(Probe::new);
      input.toTable(
          Materialized.<Bytes, Bytes, KeyValueStore<Bytes, byte[]>>as(TABLE_STORE)
              .withKeySerde(Serdes.Bytes())
              .withValueSerde(Serdes.Bytes()));
      if (withCount) {
        input.groupByKey().count(Materialized.as(COUNT_STORE));
      }

      Properties props = new Properties();
      props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
      props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
      props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
      props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
      if (compact) {
        props.put(StreamsConfig.topicPrefix("segment.bytes"), String.valueOf(1024 * 1024));
      }
      // Everything else stays at Kafka Streams' defaults: one stream thread, RocksDB stores,
      // a 10 MB record cache, 30 s commit interval, changelogs created by Streams.

      Restores restores = new Restores();
      AtomicLong runningNanos = new AtomicLong(0);
      KafkaStreams streams = new KafkaStreams(builder.build(), props);
      streams.setGlobalStateRestoreListener(restores);
      streams.setStateListener(
          (now, before) -> {
            if (now == KafkaStreams.State.RUNNING) {
              runningNanos.compareAndSet(0, System.nanoTime());
            }
          });
      // In restore mode every non-empty changelog partition must be restored before the app counts
      // as ready (with the state updater thread, RUNNING can come before the restores end).
      long toRestore = 0;
      if (mode.equals("restore")) {
        List<String> changelogs = new ArrayList<>();
        changelogs.add(appId + "-" + TABLE_STORE + "-changelog");
        if (withCount) {
          changelogs.add(appId + "-" + COUNT_STORE + "-changelog");
        }
        for (String changelog : changelogs) {
          toRestore += endOffsets(admin, changelog).values().stream().filter(x -> x > 0).count();
        }
      }
      if (mode.equals("restore")) {
        evictOldMembers(admin, appId);
      }
      long t0 = System.nanoTime();
      streams.start();
      while (runningNanos.get() == 0
          || restores.partitionsDone.get() < toRestore
          || !caughtUp(ends)) {
        if (System.nanoTime() > deadline) {
          streams.close(Duration.ofSeconds(10));
          throw new TimeoutException(
              "Kafka Streams did not catch up with " + topic + " before the deadline: "
                  + PROCESSED + " of " + ends);
        }
        if (streams.state() == KafkaStreams.State.ERROR) {
          throw new IllegalStateException("Kafka Streams went to ERROR (see stderr)");
        }
        Thread.sleep(20);
      }
      long caughtUp = System.nanoTime();
      long keys = approximateKeys(streams);
      // Flushes caches into the changelogs and leaves the group: the next start then restores at
      // once. A default close() or a crash leaves the member in the group, and the next start waits
      // up to session.timeout.ms (45 s) for it to expire first: restart cost, not restore cost.
      streams.close(
          new KafkaStreams.CloseOptions().timeout(Duration.ofSeconds(60)).leaveGroup(true));
      long closed = System.nanoTime();
      long bytesBefore = changelogBytes(admin, appId);
      long bytesAfter = bytesBefore;
      if (compact && mode.equals("build")) {
        bytesAfter = awaitCompaction(admin, appId, bytesBefore, deadline);
      }

      Map<String, Long> restored = new HashMap<>();
      restores.records.forEach((k, v) -> restored.put(k, v.get()));
      StringBuilder out = new StringBuilder("{");
      out.append("\"mode\":\"").append(mode).append('"');
      out.append(",\"input_records\":").append(ends.values().stream().mapToLong(x -> x).sum());
      out.append(",\"seconds_to_running\":").append(secs(t0, runningNanos.get()));
      out.append(",\"seconds_to_caught_up\":").append(secs(t0, caughtUp));
      out.append(",\"seconds_to_restored\":")
          .append(
              restores.lastEndNanos.get() == 0
                  ? secs(t0, runningNanos.get())
                  : secs(t0, Math.max(runningNanos.get(), restores.lastEndNanos.get())));
      out.append(",\"close_seconds\":").append(secs(caughtUp, closed));
      out.append(",\"restore_seconds\":")
          .append(
              restores.firstStartNanos.get() == 0
                  ? "0"
                  : secs(restores.firstStartNanos.get(), restores.lastEndNanos.get()));
      out.append(",\"records_restored\":").append(restored.values().stream().mapToLong(x -> x).sum());
      out.append(",\"records_restored_by_store\":{");
      List<String> parts = new ArrayList<>();
      restored.forEach((k, v) -> parts.add("\"" + k + "\":" + v));
      out.append(String.join(",", parts)).append('}');
      out.append(",\"approx_keys\":").append(keys);
      out.append(",\"changelog_bytes_written\":").append(bytesBefore);
      out.append(",\"changelog_bytes\":").append(bytesAfter);
      out.append('}');
      System.out.println(out);
    }
  }

  /**
   * The build run is gone but, since Kafka Streams' close() does not send LeaveGroup for dynamic
   * members (internal.leave.group.on.close=false, and 4.1's CloseOptions.leaveGroup did not change
   * that here), its member stays in the group until session.timeout.ms (45 s) expires and the new
   * member's join waits for it. Remove it first, as an operator replacing a host would: the timing
   * is then restore cost only. The wait itself is reported separately by benchmarks/peers.py.
   */
  private static void evictOldMembers(Admin admin, String appId) {
    try {
      admin
          .removeMembersFromConsumerGroup(appId, new RemoveMembersFromConsumerGroupOptions())
          .all()
          .get(30, TimeUnit.SECONDS);
    } catch (ExecutionException e) {
      System.err.println("no old members to remove from " + appId + ": " + e.getCause());
    } catch (InterruptedException | TimeoutException e) {
      throw new IllegalStateException("removing old members of " + appId + ": " + e, e);
    }
  }

  /**
   * Polls the changelogs' size until it has not changed for 5 s. The dev broker's cleaner wakes
   * every 200 ms and may already have compacted them while close() ran, so "shrank" cannot be the
   * test; the restore's record count shows what compaction left.
   */
  private static long awaitCompaction(Admin admin, String appId, long before, long deadline)
      throws InterruptedException {
    long last = before;
    long stableSince = System.nanoTime();
    while (System.nanoTime() < deadline) {
      Thread.sleep(500);
      long now = changelogBytes(admin, appId);
      if (now != last) {
        last = now;
        stableSince = System.nanoTime();
      } else if (System.nanoTime() - stableSince > TimeUnit.SECONDS.toNanos(5)) {
        return last;
      }
    }
    System.err.println("changelogs of " + appId + " were still changing at the deadline");
    return last;
  }

  private static boolean caughtUp(Map<Integer, Long> ends) {
    for (Map.Entry<Integer, Long> e : ends.entrySet()) {
      if (e.getValue() > 0 && PROCESSED.getOrDefault(e.getKey(), 0L) < e.getValue()) {
        return false;
      }
    }
    return true;
  }

  private static String secs(long from, long to) {
    return to == 0 ? "null" : String.format("%.3f", (to - from) / 1e9);
  }

  private static Map<Integer, Long> endOffsets(Admin admin, String topic)
      throws InterruptedException, ExecutionException, TimeoutException {
    TopicDescription d =
        admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS).get(topic);
    Map<TopicPartition, OffsetSpec> req = new HashMap<>();
    d.partitions().forEach(p -> req.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest()));
    Map<Integer, Long> ends = new HashMap<>();
    admin
        .listOffsets(req)
        .all()
        .get(30, TimeUnit.SECONDS)
        .forEach((tp, info) -> ends.put(tp.partition(), info.offset()));
    return ends;
  }

  /** RocksDB's own estimate of the table's key count: a sanity check, not a figure to compare. */
  private static long approximateKeys(KafkaStreams streams) {
    try {
      return streams
          .store(
              StoreQueryParameters.fromNameAndType(
                  TABLE_STORE, QueryableStoreTypes.<Bytes, Bytes>keyValueStore()))
          .approximateNumEntries();
    } catch (RuntimeException e) {
      return -1;
    }
  }

  /** On-disk size of this application's changelog partitions, from the broker's log dirs. */
  private static long changelogBytes(Admin admin, String appId) {
    try {
      List<Integer> brokers = new ArrayList<>();
      for (Node n : admin.describeCluster().nodes().get(30, TimeUnit.SECONDS)) {
        brokers.add(n.id());
      }
      long total = 0;
      for (Map<String, LogDirDescription> dirs :
          admin.describeLogDirs(brokers).allDescriptions().get(30, TimeUnit.SECONDS).values()) {
        for (LogDirDescription dir : dirs.values()) {
          for (Map.Entry<TopicPartition, ReplicaInfo> r : dir.replicaInfos().entrySet()) {
            String t = r.getKey().topic();
            if (t.startsWith(appId + "-") && t.endsWith("-changelog")) {
              total += r.getValue().size();
            }
          }
        }
      }
      return total;
    } catch (InterruptedException | ExecutionException | TimeoutException e) {
      return -1;
    }
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
