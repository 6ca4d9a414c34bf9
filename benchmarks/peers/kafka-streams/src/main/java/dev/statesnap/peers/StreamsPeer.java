package dev.statesnap.peers;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.ReplicaInfo;
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

  private StreamsPeer() {}

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

    PeerRun.wipe(stateDir); // "restore" means the local state is gone: a new host or a lost disk
    Files.createDirectories(stateDir);

    try (Admin admin = PeerRun.admin(bootstrap)) {
      Map<Integer, Long> ends = PeerRun.endOffsets(admin, topic);
      PeerRun.startFromCommitted(admin, appId, topic);

      StreamsBuilder builder = new StreamsBuilder();
      KStream<Bytes, Bytes> input =
          builder.stream(topic, Consumed.with(Serdes.Bytes(), Serdes.Bytes()));
      input.processValues(PeerRun.Probe::new);
      input.toTable(
          Materialized.<Bytes, Bytes, KeyValueStore<Bytes, byte[]>>as(TABLE_STORE)
              .withKeySerde(Serdes.Bytes())
              .withValueSerde(Serdes.Bytes()));
      if (withCount) {
        input.groupByKey().count(Materialized.as(COUNT_STORE));
      }

      Properties props = PeerRun.props(appId, bootstrap, stateDir.toString());
      if (compact) {
        props.put(StreamsConfig.topicPrefix("segment.bytes"), String.valueOf(1024 * 1024));
      }
      // Everything else stays at Kafka Streams' defaults: one stream thread, RocksDB stores,
      // a 10 MB record cache, 30 s commit interval, changelogs created by Streams.

      PeerRun run = new PeerRun(builder.build(), props);
      PeerRun.Restores restores = run.restores;
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
          toRestore += PeerRun.endOffsets(admin, changelog).values().stream().filter(x -> x > 0).count();
        }
        PeerRun.evictOldMembers(admin, appId);
      }
      long restoring = toRestore;
      long caughtUp =
          run.startAndAwait(ends, topic, deadline, 20, () -> restores.partitionsDone.get() >= restoring);
      long t0 = run.startNanos;
      long running = run.runningNanos.get();
      long keys = approximateKeys(run.streams);
      run.close();
      long closed = System.nanoTime();
      long bytesBefore = changelogBytes(admin, appId);
      long bytesAfter = bytesBefore;
      if (compact && mode.equals("build")) {
        bytesAfter = awaitCompaction(admin, appId, bytesBefore, deadline);
      }

      Map<String, Long> restored = new HashMap<>();
      restores.records.forEach((k, v) -> restored.put(k, v.get()));
      List<String> parts = new ArrayList<>();
      restored.forEach((k, v) -> parts.add("\"" + k + "\":" + v));
      long lastEnd = restores.lastEndNanos.get();
      new PeerRun.JsonLine()
          .putString("mode", mode)
          .put("input_records", PeerRun.sum(ends))
          .put("seconds_to_running", PeerRun.secs(t0, running))
          .put("seconds_to_caught_up", PeerRun.secs(t0, caughtUp))
          .put(
              "seconds_to_restored",
              PeerRun.secs(t0, lastEnd == 0 ? running : Math.max(running, lastEnd)))
          .put("close_seconds", PeerRun.secs(caughtUp, closed))
          .put("restore_seconds", restores.seconds())
          .put("records_restored", restores.total())
          .put("records_restored_by_store", "{" + String.join(",", parts) + "}")
          .put("approx_keys", keys)
          .put("changelog_bytes_written", bytesBefore)
          .put("changelog_bytes", bytesAfter)
          .print();
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
}
