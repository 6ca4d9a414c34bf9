"""confluent-kafka for the Spark jobs: where a partition ends (driver) and reading ranges (tasks).

Two rules keep reads exact on every broker, including the dev broker (Tansu):

- **The end of a partition is found by partition EOF, never by the high watermark alone.** The
  dev broker under-reports the high watermark (it is the base offset of the last record batch + 1),
  so :class:`OffsetOracle` uses the reported end only as a *lower bound* to start probing from and
  consumes to librdkafka's partition-EOF event, whose offset is the true end (on Apache Kafka the
  probe starts at the end and EOF arrives at once).
- **A range [start, end) is read until its last offset or an EOF at/after end**, so gaps at the
  end of a range (transaction markers) do not make a task wait forever.

Partitions are assigned without a consumer group (``assign``, never ``subscribe``); nothing is ever
committed. ``group.id`` is set only because librdkafka requires one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from statesnap.checkpoint import datafile
from statesnap.errors import BrokerUnavailableError, KafkaError, TopicNotFoundError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.spark.options import KafkaSourceOptions

log = logging.getLogger(__name__)

#: Spark's Kafka schema as Arrow, exactly as Spark converts it (timestamps in µs, UTC).
SPARK_ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
)

#: Messages per consume() call: large batches amortize the per-call Python cost.
BATCH_SIZE = 10_000
_PROBE_POLL = 0.05
#: A partition still receiving records after this long settles on the last record seen.
PROBE_SETTLE_SECONDS = 1.0

#: Consumer defaults the user's ``kafka.*`` options may override.
_TUNING: dict[str, Any] = {
    # Without a short fetch wait every end-of-data probe costs the broker's default (500 ms).
    "fetch.wait.max.ms": 10,
    # librdkafka backs off 1 s whenever its local queue is "full"; measured on the dev broker this
    # idles the consumer most of the time (2.6 s vs 0.7 s for 1 M records). 5 ms keeps it busy.
    "fetch.queue.backoff.ms": 5,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "queued.max.messages.kbytes": 128 * 1024,
}
#: Settings exact range reads depend on; they always win.
_REQUIRED: dict[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
}

_KEY = Message.key
_VALUE = Message.value
_OFFSET = Message.offset
_TIMESTAMP = Message.timestamp
_ERROR = Message.error


def consumer_config(opts: KafkaSourceOptions, **overrides: Any) -> dict[str, Any]:
    """Our tuning, then the user's librdkafka properties, then what correctness requires."""
    conf: dict[str, Any] = {
        "bootstrap.servers": opts.bootstrap_servers,
        "client.id": "statesnap-spark",
        "group.id": f"statesnap-spark-{opts.topic}",
    }
    conf.update(_TUNING)
    conf.update(opts.kafka_config)
    conf.update(_REQUIRED)
    conf.update(overrides)
    return conf


class OffsetOracle:
    """Driver-side answers about the topic: partitions, earliest offsets and true end offsets.

    Keeps one admin client and one consumer for its lifetime (a streaming source asks every
    trigger); call :meth:`close` when done.
    """

    def __init__(self, opts: KafkaSourceOptions) -> None:
        self.opts = opts
        self._timeout = opts.metadata_timeout_ms / 1000
        self._admin: AdminClient | None = None
        self._metadata: KafkaAdmin | None = None
        self._consumer: Consumer | None = None
        #: Highest end seen per partition: ends never go backwards, so probing starts here.
        self.known_ends: dict[int, int] = {}

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self.opts.settings().client_config())
        return self._admin

    def partitions(self) -> tuple[int, ...]:
        """Partitions of the topic; typed errors name the option that is wrong."""
        if self._metadata is None:
            self._metadata = KafkaAdmin(self.opts.settings())
        try:
            return self._metadata.partitions(self.opts.topic)
        except TopicNotFoundError as e:
            raise TopicNotFoundError(f"option subscribe: {e}") from e
        except BrokerUnavailableError as e:
            raise BrokerUnavailableError(f"option kafka.bootstrap.servers: {e}") from e

    def _list_offsets(self, partitions: Sequence[int], spec: Any) -> dict[int, int]:
        iso = IsolationLevel.READ_COMMITTED if self.opts.read_committed else IsolationLevel.READ_UNCOMMITTED
        request = {TopicPartition(self.opts.topic, p): spec for p in partitions}
        try:
            futures = self.admin.list_offsets(request, isolation_level=iso, request_timeout=self._timeout)
            return {
                tp.partition: max(0, int(f.result(timeout=self._timeout).offset)) for tp, f in futures.items()
            }
        except Exception as e:  # KafkaException, or a plain timeout from the future
            raise BrokerUnavailableError(
                f"option kafka.bootstrap.servers: cannot list offsets of {self.opts.topic!r} "
                f"at {self.opts.bootstrap_servers} within {self._timeout:g}s: {e}"
            ) from e

    def earliest(self, partitions: Sequence[int]) -> dict[int, int]:
        """First offset still stored per partition (the low watermark is exact everywhere)."""
        return self._list_offsets(partitions, OffsetSpec.earliest()) if partitions else {}  # type: ignore[no-untyped-call]

    def latest(self, partitions: Sequence[int]) -> dict[int, int]:
        """The end (next offset to be written) per partition, found by partition EOF.

        Probing starts at the reported end (exact on Kafka, too small on the dev broker) and
        reads to EOF. On a partition that keeps receiving records faster than EOF can be seen,
        the probe settles after :data:`PROBE_SETTLE_SECONDS` on the last record it saw: any
        offset that exists is a valid end, only a promise of records that do not exist is not.
        """
        if not partitions:
            return {}
        hints = self._list_offsets(partitions, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        starts = {p: max(hints.get(p, 0), self.known_ends.get(p, 0)) for p in partitions}
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self.opts))
        consumer = self._consumer
        ends = dict(starts)
        pending, seen = set(partitions), set[int]()
        consumer.assign([TopicPartition(self.opts.topic, p, starts[p]) for p in partitions])
        began = time.monotonic()
        try:
            while pending:
                waited = time.monotonic() - began
                if waited > PROBE_SETTLE_SECONDS:
                    pending -= seen
                    if not pending:
                        break
                if waited > self._timeout:
                    raise BrokerUnavailableError(
                        f"option kafka.bootstrap.servers: no end-of-partition answer for "
                        f"{self.opts.topic!r} partitions {sorted(pending)} from "
                        f"{self.opts.bootstrap_servers} within {self._timeout:g}s"
                    )
                msg: Any
                for msg in consumer.consume(BATCH_SIZE, _PROBE_POLL):
                    err = msg.error()
                    p = msg.partition()
                    if err is None:
                        ends[p] = max(ends[p], msg.offset() + 1)
                        seen.add(p)
                    elif err.code() == RdKafkaError._PARTITION_EOF:
                        ends[p] = max(ends[p], int(msg.offset()))
                        pending.discard(p)
                    else:
                        _raise_or_warn(err, self.opts, p)
        except KafkaException as e:
            raise KafkaError(f"probing the end of {self.opts.topic!r}: {e}") from e
        finally:
            consumer.unassign()
        for p, end in ends.items():
            self.known_ends[p] = max(self.known_ends.get(p, 0), end)
        return {p: self.known_ends[p] for p in partitions}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None
        self._metadata = None


def _raise_or_warn(err: Any, opts: KafkaSourceOptions, partition: int) -> None:
    code = err.code()
    if code == RdKafkaError._ALL_BROKERS_DOWN or err.fatal():
        raise BrokerUnavailableError(
            f"option kafka.bootstrap.servers: lost {opts.bootstrap_servers} while reading "
            f"{opts.topic!r}[{partition}]: {err.str()}"
        )
    if code in (RdKafkaError.UNKNOWN_TOPIC_OR_PART, RdKafkaError._UNKNOWN_TOPIC):
        raise TopicNotFoundError(f"option subscribe: topic {opts.topic!r} disappeared: {err.str()}")
    log.warning("Kafka error on %s[%d]: %s", opts.topic, partition, err.str())


def iter_range(opts: KafkaSourceOptions, partition: int, start: int, end: int) -> Iterator[list[Any]]:
    """Every message of ``[start, end)`` of one partition, in offset order, in large batches.

    Ends at the range's last offset, or at an EOF at/after *end* (gaps such as transaction markers
    at the end of a range). Records the range promises but that do not arrive within
    ``kafkaConsumer.pollTimeoutMs`` fail the task instead of hanging it.
    """
    if end <= start:
        return
    consumer = Consumer(consumer_config(opts))
    tp = TopicPartition(opts.topic, partition, start)
    try:
        if start > 0:
            low, _high = consumer.get_watermark_offsets(tp, timeout=opts.metadata_timeout_ms / 1000)
            if start < low:
                if opts.fail_on_data_loss:
                    raise KafkaError(
                        f"{opts.topic}[{partition}]: offsets {start}..{low - 1} were deleted by "
                        "retention before they were read; set failOnDataLoss=false to skip them"
                    )
                log.warning("%s[%d]: skipping deleted offsets %d..%d", opts.topic, partition, start, low - 1)
        consumer.assign([tp])
        last_progress = time.monotonic()
        timeout = opts.poll_timeout_ms / 1000
        position = start
        while True:
            # Ask for no more than the range still holds: consume() returns as soon as it has
            # that many, instead of waiting out its timeout for a full batch at the range's end.
            wanted = max(1, min(BATCH_SIZE, end - position))
            msgs: list[Any] = consumer.consume(wanted, 0.1)
            if not msgs:
                if time.monotonic() - last_progress > timeout:
                    raise KafkaError(
                        f"{opts.topic}[{partition}]: no records for {timeout:g}s while reading "
                        f"offsets {start}..{end - 1} (kafkaConsumer.pollTimeoutMs)"
                    )
                continue
            last_progress = time.monotonic()
            done = False
            if any(map(_ERROR, msgs)):
                good = []
                for m in msgs:
                    err = m.error()
                    if err is None:
                        good.append(m)
                    elif err.code() == RdKafkaError._PARTITION_EOF:
                        done = done or m.offset() >= end
                    else:
                        _raise_or_warn(err, opts, partition)
                msgs = good
            if msgs and (msgs[0].offset() < start or msgs[-1].offset() >= end):
                msgs = [m for m in msgs if start <= m.offset() < end]
            if msgs:
                position = msgs[-1].offset() + 1
                done = done or position >= end
                yield msgs
            if done:
                return
    except KafkaException as e:
        raise KafkaError(f"reading {opts.topic}[{partition}]: {e}") from e
    finally:
        consumer.close()


def _timestamps(msgs: list[Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(librdkafka timestamp types, timestamps in ms) of *msgs*, flattened in one C-level pass."""
    n = len(msgs)
    pairs = np.fromiter(chain.from_iterable(map(_TIMESTAMP, msgs)), np.int64, 2 * n).reshape(n, 2)
    return pairs[:, 0].astype(np.int32), pairs[:, 1]


def spark_batch(msgs: list[Any], topic: str, partition: int) -> pa.RecordBatch:
    """Messages as one Arrow batch in Spark's Kafka schema (column-wise, no per-row objects).

    ``timestampType`` follows Kafka's Java ids (0 create time, 1 log-append time, -1 none);
    a missing timestamp is null.
    """
    n = len(msgs)
    types, millis = _timestamps(msgs)
    missing = types == 0
    return pa.RecordBatch.from_arrays(
        [
            pa.array(list(map(_KEY, msgs)), pa.binary()),
            pa.array(list(map(_VALUE, msgs)), pa.binary()),
            pa.DictionaryArray.from_arrays(np.zeros(n, np.int8), [topic]).dictionary_decode(),
            pa.array(np.full(n, partition, np.int32)),
            pa.array(np.fromiter(map(_OFFSET, msgs), np.int64, n)),
            pa.array(millis * 1000, pa.timestamp("us", tz="UTC"), mask=missing if missing.any() else None),
            pa.array(types - 1),
        ],
        schema=SPARK_ARROW_SCHEMA,
    )


def change_table(msgs: list[Any]) -> pa.Table:
    """Messages as data-file rows (tombstones kept); records without a key are skipped,
    as a :class:`~statesnap.Table` skips them."""
    types, millis = _timestamps(msgs)
    missing = types == 0
    keys = pa.array(list(map(_KEY, msgs)), pa.binary())
    table = pa.Table.from_arrays(
        [
            keys,
            pa.array(list(map(_VALUE, msgs)), pa.binary()),
            pa.array(np.fromiter(map(_OFFSET, msgs), np.int64, len(msgs))),
            pa.array(millis, pa.timestamp("ms"), mask=missing if missing.any() else None),
        ],
        schema=datafile.SCHEMA,
    )
    if keys.null_count:
        table = table.filter(pc.is_valid(keys))
    return table


def split_ranges(
    ranges: Mapping[int, tuple[int, int]],
    *,
    min_partitions: int | None,
    max_records: int | None,
    min_split: int = 1,
) -> list[tuple[int, int, int]]:
    """Cut per-partition ``[start, end)`` ranges into ``(partition, start, end)`` splits.

    Ranges longer than *max_records* are cut; then, while there are fewer splits than
    *min_partitions*, the biggest splits are halved (never below *min_split* records), so every
    core gets work even when the topic has fewer partitions than the cluster has cores.
    """
    pieces: list[tuple[int, int, int]] = []
    for p, (start, end) in sorted(ranges.items()):
        if end <= start:
            continue
        n = 1 if not max_records else -(-(end - start) // max_records)
        pieces.extend(_cut(p, start, end, n))
    want = min_partitions or 0
    while pieces and len(pieces) < want:
        size, idx = max((e - s, i) for i, (_p, s, e) in enumerate(pieces))
        if size < 2 * min_split:
            break
        p, s, e = pieces.pop(idx)
        pieces[idx:idx] = _cut(p, s, e, 2)
    return sorted(pieces)


def _cut(partition: int, start: int, end: int, n: int) -> list[tuple[int, int, int]]:
    bounds = [start + (end - start) * i // n for i in range(n + 1)]
    return [(partition, a, b) for a, b in pairwise(bounds) if b > a]
