package dev.statesnap.peers;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
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
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;

/**
 * The Kafka Streams side of {@code benchmarks/count_peers.py}: a count per key ({@code
 * groupByKey().count()}) or a 1-minute tumbling-window count per key ({@code
 * groupByKey().windowedBy(TimeWindows.ofSizeWithNoGrace(1 min)).count()}), as a user writes it,
 * everything else at Kafka Streams' defaults (one stream thread, RocksDB, 10 MB cache, changelogs).
 *
 * <p>One run: start, process the input up to the end offsets seen at start (told by a
 * pass-through probe, so no commit interval or lag metric delays the measure), then read the whole
 * store through interactive queries into DUMP_FILE ({@code key TAB count} or {@code key TAB
 * window-start TAB count}: the driver checks it against its plain loop), then close (flushes the
 * caches into the changelogs, commits). A second run with the same APP_ID processes only what came
 * since: with {@code wipe} its state directory is deleted first (restore from the changelogs, a new
 * host), without it the local RocksDB state is reused.
 *
 * <p>Prints one JSON line on stdout; everything else goes to stderr.
 *
 * <p>Usage: {@code CountPeer BOOTSTRAP TOPIC APP_ID STATE_DIR TIMEOUT_S DUMP_FILE [window] [eos]
 * [wipe]}
 */
public final class CountPeer {
  private static final String STORE = "counts";
  private static final long WINDOW_MS = 60_000;

  /** Highest processed offset + 1 per input partition, written by the stream thread. */
  private static final Map<Integer, Long> PROCESSED = new ConcurrentHashMap<>();

  private static final AtomicLong PROCESSED_RECORDS = new AtomicLong();

  private CountPeer() {}

  /** Records each input record's position; forwards nothing (a probe, not part of the result). */
  static final class Probe implements FixedKeyProcessor<Bytes, Bytes, Bytes> {
    private FixedKeyProcessorContext<Bytes, Bytes> context;

    @Override
    public void init(FixedKeyProcessorContext<Bytes, Bytes> context) {
      this.context = context;
    }

    @Override
    public void process(FixedKeyRecord<Bytes, Bytes> record) {
      PROCESSED_RECORDS.incrementAndGet();
      context
          .recordMetadata()
          .ifPresent(m -> PROCESSED.merge(m.partition(), m.offset() + 1, Math::max));
    }
  }

  /** Sums what the restore consumer replays, and when restores start and end. */
  static final class Restores implements StateRestoreListener {
    final AtomicLong records = new AtomicLong();
    final AtomicLong firstStartNanos = new AtomicLong(0);
    final AtomicLong lastEndNanos = new AtomicLong(0);

    @Override
    public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
      firstStartNanos.compareAndSet(0, System.nanoTime());
    }

    @Override
    public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long n) {}

    @Override
    public void onRestoreEnd(TopicPartition tp, String store, long total) {
      records.addAndGet(total);
      lastEndNanos.set(System.nanoTime());
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 6) {
      System.err.println(
          "usage: CountPeer BOOTSTRAP TOPIC APP_ID STATE_DIR TIMEOUT_S DUMP_FILE [window] [eos] [wipe]");
      System.exit(2);
    }
    String bootstrap = args[0];
    String topic = args[1];
    String appId = args[2];
    Path stateDir = Path.of(args[3]);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[4]));
    Path dump = Path.of(args[5]);
    List<String> flags = List.of(args).subList(6, args.length);
    boolean windowed = flags.contains("window");
    boolean eos = flags.contains("eos");
    if (flags.contains("wipe")) {
      wipe(stateDir); // the local state is gone: a new host or a lost disk
    }
    Files.createDirectories(stateDir);

    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    try (Admin admin = Admin.create(adminProps)) {
      Map<Integer, Long> ends = endOffsets(admin, topic);
      // A partition with no records since the last commit has nothing to process: the probe starts
      // at the committed offsets so it does not wait for records that will never come.
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
      boolean restart = !PROCESSED.isEmpty();

      StreamsBuilder builder = new StreamsBuilder();
      KStream<Bytes, Bytes> input =
          builder.stream(topic, Consumed.with(Serdes.Bytes(), Serdes.Bytes()));
      input.processValues(Probe::new);
      if (windowed) {
        input
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMillis(WINDOW_MS)))
            .count(Materialized.as(STORE));
      } else {
        input.groupByKey().count(Materialized.as(STORE));
      }

      Properties props = new Properties();
      props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
      props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
      props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
      props.put(
          StreamsConfig.PROCESSING_GUARANTEE_CONFIG,
          eos ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE);
      props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
      props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1); // one broker

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
      if (restart) {
        evictOldMembers(admin, appId);
      }
      long t0 = System.nanoTime();
      streams.start();
      while (runningNanos.get() == 0 || !caughtUp(ends)) {
        if (System.nanoTime() > deadline) {
          streams.close(Duration.ofSeconds(10));
          throw new TimeoutException(
              "Kafka Streams did not catch up with " + topic + " before the deadline: "
                  + PROCESSED + " of " + ends);
        }
        if (streams.state() == KafkaStreams.State.ERROR) {
          throw new IllegalStateException("Kafka Streams went to ERROR (see stderr)");
        }
        Thread.sleep(5);
      }
      long caughtUp = System.nanoTime();
      long rows = windowed ? dumpWindows(streams, dump) : dumpCounts(streams, dump);
      long dumped = System.nanoTime();
      streams.close(
          new KafkaStreams.CloseOptions().timeout(Duration.ofSeconds(60)).leaveGroup(true));
      long closed = System.nanoTime();

      StringBuilder out = new StringBuilder("{");
      out.append("\"input_records\":").append(ends.values().stream().mapToLong(x -> x).sum());
      out.append(",\"processed_records\":").append(PROCESSED_RECORDS.get());
      out.append(",\"seconds_to_running\":").append(secs(t0, runningNanos.get()));
      out.append(",\"seconds_to_caught_up\":").append(secs(t0, caughtUp));
      out.append(",\"restore_seconds\":")
          .append(
              restores.firstStartNanos.get() == 0
                  ? "0"
                  : secs(restores.firstStartNanos.get(), restores.lastEndNanos.get()));
      out.append(",\"records_restored\":").append(restores.records.get());
      out.append(",\"dump_seconds\":").append(secs(caughtUp, dumped));
      out.append(",\"close_seconds\":").append(secs(dumped, closed));
      out.append(",\"state_rows\":").append(rows);
      out.append('}');
      System.out.println(out);
    }
  }

  private static long dumpCounts(KafkaStreams streams, Path dump) throws IOException {
    ReadOnlyKeyValueStore<Bytes, Long> store =
        streams.store(
            StoreQueryParameters.fromNameAndType(
                STORE, QueryableStoreTypes.<Bytes, Long>keyValueStore()));
    long n = 0;
    try (BufferedWriter w = Files.newBufferedWriter(dump, StandardCharsets.UTF_8);
        KeyValueIterator<Bytes, Long> it = store.all()) {
      while (it.hasNext()) {
        KeyValue<Bytes, Long> kv = it.next();
        w.write(new String(kv.key.get(), StandardCharsets.UTF_8));
        w.write('\t');
        w.write(Long.toString(kv.value));
        w.write('\n');
        n++;
      }
    }
    return n;
  }

  /** Every window the store still returns (expired ones may linger until their segment drops). */
  private static long dumpWindows(KafkaStreams streams, Path dump) throws IOException {
    ReadOnlyWindowStore<Bytes, Long> store =
        streams.store(
            StoreQueryParameters.fromNameAndType(
                STORE, QueryableStoreTypes.<Bytes, Long>windowStore()));
    long n = 0;
    try (BufferedWriter w = Files.newBufferedWriter(dump, StandardCharsets.UTF_8);
        KeyValueIterator<Windowed<Bytes>, Long> it = store.all()) {
      while (it.hasNext()) {
        KeyValue<Windowed<Bytes>, Long> kv = it.next();
        w.write(new String(kv.key.key().get(), StandardCharsets.UTF_8));
        w.write('\t');
        w.write(Long.toString(kv.key.window().start()));
        w.write('\t');
        w.write(Long.toString(kv.value));
        w.write('\n');
        n++;
      }
    }
    return n;
  }

  /**
   * The previous run's member stays in the group until session.timeout.ms (45 s) unless removed
   * (see StreamsPeer#evictOldMembers): removed first, as an operator replacing a host would, so the
   * timing is restore and tail cost, not a session timeout.
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
