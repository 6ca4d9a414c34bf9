package dev.statesnap.peers;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
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

  private CountPeer() {}

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
      PeerRun.wipe(stateDir); // the local state is gone: a new host or a lost disk
    }
    Files.createDirectories(stateDir);

    try (Admin admin = PeerRun.admin(bootstrap)) {
      Map<Integer, Long> ends = PeerRun.endOffsets(admin, topic);
      boolean restart = PeerRun.startFromCommitted(admin, appId, topic);

      StreamsBuilder builder = new StreamsBuilder();
      KStream<Bytes, Bytes> input =
          builder.stream(topic, Consumed.with(Serdes.Bytes(), Serdes.Bytes()));
      input.processValues(PeerRun.Probe::new);
      if (windowed) {
        input
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMillis(WINDOW_MS)))
            .count(Materialized.as(STORE));
      } else {
        input.groupByKey().count(Materialized.as(STORE));
      }

      Properties props = PeerRun.props(appId, bootstrap, stateDir.toString());
      props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, PeerRun.guarantee(eos));
      props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1); // one broker

      PeerRun run = new PeerRun(builder.build(), props);
      if (restart) {
        PeerRun.evictOldMembers(admin, appId);
      }
      long caughtUp = run.startAndAwait(ends, topic, deadline, 5, () -> true);
      long rows = windowed ? dumpWindows(run.streams, dump) : dumpCounts(run.streams, dump);
      long dumped = System.nanoTime();
      run.close();
      long closed = System.nanoTime();

      new PeerRun.JsonLine()
          .put("input_records", PeerRun.sum(ends))
          .put("processed_records", PeerRun.PROCESSED_RECORDS.get())
          .put("seconds_to_running", PeerRun.secs(run.startNanos, run.runningNanos.get()))
          .put("seconds_to_caught_up", PeerRun.secs(run.startNanos, caughtUp))
          .put("restore_seconds", run.restores.seconds())
          .put("records_restored", run.restores.total())
          .put("dump_seconds", PeerRun.secs(caughtUp, dumped))
          .put("close_seconds", PeerRun.secs(dumped, closed))
          .put("state_rows", rows)
          .print();
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
}
