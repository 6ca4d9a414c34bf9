package dev.statesnap.peers;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * The Kafka Streams side of {@code benchmarks/final_results.py}: a tumbling-window count per key
 * whose final result per window goes to an output topic once the window closes, as a user writes
 * it: {@code groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(size, grace)).count()
 * .suppress(Suppressed.untilWindowCloses(unbounded())).toStream().to(out)}.
 *
 * <p>The output keeps the input key (the window goes into the value, not a {@code Windowed} key)
 * and its value is statesnap's and Quix's layout, {@code {"start": S, "end": E, "value": N}}, so
 * the driver compares every contender's final results record for record.
 *
 * <p>It runs until the driver stops it (SIGTERM: a clean close) or TIMEOUT_S passes. The driver
 * times it by what reaches the output topic, so this process prints nothing but one "RUNNING"
 * line on stderr (when the group assigned its tasks).
 *
 * <p>Usage: {@code FinalCountPeer BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR SIZE_MS GRACE_MS
 * COMMIT_INTERVAL_MS CACHE_BYTES TIMEOUT_S [eos]}
 */
public final class FinalCountPeer {
  private FinalCountPeer() {}

  public static void main(String[] args) throws InterruptedException {
    if (args.length < 10) {
      System.err.println(
          "usage: FinalCountPeer BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR SIZE_MS GRACE_MS"
              + " COMMIT_INTERVAL_MS CACHE_BYTES TIMEOUT_S [eos]");
      System.exit(2);
    }
    String bootstrap = args[0];
    String input = args[1];
    String output = args[2];
    long sizeMs = Long.parseLong(args[5]);
    long graceMs = Long.parseLong(args[6]);
    long timeoutS = Long.parseLong(args[9]);
    boolean eos = args.length > 10 && args[10].equals("eos");

    Properties props = PeerRun.props(args[3], bootstrap, args[4]);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args[7]));
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(args[8]));
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, PeerRun.guarantee(eos));
    // One broker: internal topics (changelogs) with one replica.
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.Bytes(), Serdes.Bytes()))
        .groupByKey()
        .windowedBy(
            TimeWindows.ofSizeAndGrace(Duration.ofMillis(sizeMs), Duration.ofMillis(graceMs)))
        .count()
        .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .map(
            (windowed, count) ->
                KeyValue.pair(
                    windowed.key(),
                    "{\"start\": "
                        + windowed.window().start()
                        + ", \"end\": "
                        + windowed.window().end()
                        + ", \"value\": "
                        + count
                        + "}"))
        .to(output, Produced.with(Serdes.Bytes(), Serdes.String()));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING) {
            System.err.println("RUNNING");
          }
          if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
            stopped.countDown();
          }
        });
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(20));
                  stopped.countDown();
                }));
    streams.start();
    if (!stopped.await(timeoutS, TimeUnit.SECONDS)) {
      System.err.println("FinalCountPeer: stopped by its " + timeoutS + " s timeout");
      streams.close(Duration.ofSeconds(20));
      System.exit(3);
    }
    System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
  }
}
