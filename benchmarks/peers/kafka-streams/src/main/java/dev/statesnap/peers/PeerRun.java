package dev.statesnap.peers;

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
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;

/**
 * What the timed Kafka Streams peers ({@link StreamsPeer}, {@link CountPeer}) share: their base
 * properties, the probe that tells when every input record up to the end offsets seen at start has
 * been processed (so no commit interval or lag metric delays the measure), the restore listener,
 * starting the app and waiting until it is caught up, a clean close, and the JSON line each prints
 * on stdout (everything else goes to stderr).
 */
final class PeerRun {
  /** Highest processed offset + 1 per input partition, written by the stream thread. */
  static final Map<Integer, Long> PROCESSED = new ConcurrentHashMap<>();

  /** Input records the probe saw in this process. */
  static final AtomicLong PROCESSED_RECORDS = new AtomicLong();

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

    long total() {
      return records.values().stream().mapToLong(AtomicLong::get).sum();
    }

    /** Seconds from the first restore's start to the last one's end ("0" without restores). */
    String seconds() {
      return firstStartNanos.get() == 0 ? "0" : secs(firstStartNanos.get(), lastEndNanos.get());
    }
  }

  /** One line of JSON: fields in the order put, values written as given (numbers, null). */
  static final class JsonLine {
    private final StringBuilder out = new StringBuilder("{");

    JsonLine put(String name, Object raw) {
      if (out.length() > 1) {
        out.append(',');
      }
      out.append('"').append(name).append("\":").append(raw);
      return this;
    }

    JsonLine putString(String name, String value) {
      return put(name, "\"" + value + "\"");
    }

    void print() {
      System.out.println(out.append('}'));
    }
  }

  final Restores restores = new Restores();
  final AtomicLong runningNanos = new AtomicLong(0);
  final KafkaStreams streams;
  long startNanos;

  /** The app, with the restore listener and a state listener that notes when it is RUNNING. */
  PeerRun(Topology topology, Properties props) {
    streams = new KafkaStreams(topology, props);
    streams.setGlobalStateRestoreListener(restores);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING) {
            runningNanos.compareAndSet(0, System.nanoTime());
          }
        });
  }

  /**
   * Starts the app and waits until it is RUNNING, {@code ready} holds and every input partition is
   * processed up to {@code ends} (checked every {@code pollMs}); the nanoTime it was caught up.
   */
  long startAndAwait(
      Map<Integer, Long> ends, String topic, long deadline, long pollMs, BooleanSupplier ready)
      throws InterruptedException, TimeoutException {
    startNanos = System.nanoTime();
    streams.start();
    while (runningNanos.get() == 0 || !ready.getAsBoolean() || !caughtUp(ends)) {
      if (System.nanoTime() > deadline) {
        streams.close(Duration.ofSeconds(10));
        throw new TimeoutException(
            "Kafka Streams did not catch up with " + topic + " before the deadline: "
                + PROCESSED + " of " + ends);
      }
      if (streams.state() == KafkaStreams.State.ERROR) {
        throw new IllegalStateException("Kafka Streams went to ERROR (see stderr)");
      }
      Thread.sleep(pollMs);
    }
    return System.nanoTime();
  }

  /**
   * Flushes caches into the changelogs, commits and leaves the group: the next start then restores
   * at once. A default close() or a crash leaves the member in the group, and the next start waits
   * up to session.timeout.ms (45 s) for it to expire first: restart cost, not restore cost.
   */
  void close() {
    streams.close(new KafkaStreams.CloseOptions().timeout(Duration.ofSeconds(60)).leaveGroup(true));
  }

  /** Application id, bootstrap, state dir, input from the earliest offset; the rest as given. */
  static Properties props(String appId, String bootstrap, String stateDir) {
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    return props;
  }

  static String guarantee(boolean eos) {
    return eos ? StreamsConfig.EXACTLY_ONCE_V2 : StreamsConfig.AT_LEAST_ONCE;
  }

  static Admin admin(String bootstrap) {
    Properties adminProps = new Properties();
    adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    return Admin.create(adminProps);
  }

  /**
   * A partition with no records since the last commit has nothing to process: the probe starts at
   * {@code appId}'s committed offsets on {@code topic} so it does not wait for records that will
   * never come. True when there were any (a restart).
   */
  static boolean startFromCommitted(Admin admin, String appId, String topic)
      throws InterruptedException, ExecutionException, TimeoutException {
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
    return !PROCESSED.isEmpty();
  }

  /**
   * The previous run is gone but, since Kafka Streams' close() does not send LeaveGroup for dynamic
   * members (internal.leave.group.on.close=false, and 4.1's CloseOptions.leaveGroup did not change
   * that here), its member stays in the group until session.timeout.ms (45 s) expires and the new
   * member's join waits for it. Remove it first, as an operator replacing a host would: the timing
   * is then restore and tail cost, not a session timeout.
   */
  static void evictOldMembers(Admin admin, String appId) {
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

  static boolean caughtUp(Map<Integer, Long> ends) {
    for (Map.Entry<Integer, Long> e : ends.entrySet()) {
      if (e.getValue() > 0 && PROCESSED.getOrDefault(e.getKey(), 0L) < e.getValue()) {
        return false;
      }
    }
    return true;
  }

  static String secs(long from, long to) {
    return to == 0 ? "null" : String.format("%.3f", (to - from) / 1e9);
  }

  static Map<Integer, Long> endOffsets(Admin admin, String topic)
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

  static long sum(Map<Integer, Long> offsets) {
    return offsets.values().stream().mapToLong(x -> x).sum();
  }

  /** Deletes {@code dir} and everything in it (the local state is gone: a new host, a lost disk). */
  static void wipe(Path dir) throws IOException {
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
