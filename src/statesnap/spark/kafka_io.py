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

Length: the driver's end probe and the tasks' range reader share the rules above and the
consumer settings that enforce them; apart, the two halves would each restate them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain, pairwise
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka.admin._listoffsets import OffsetSpec

from statesnap.checkpoint import datafile
from statesnap.errors import BrokerUnavailableError, DataLossError, KafkaError, TopicNotFoundError
from statesnap.kafka.clients import ConnectionErrors, new_watched_admin
from statesnap.kafka.fatal import fatal_error, is_fatal
from statesnap.spark.options import TP, KafkaSourceOptions

__all__ = [
    "BATCH_SIZE",
    "HEADERS_ARROW",
    "PROBE_SETTLE_SECONDS",
    "SPARK_ARROW_SCHEMA",
    "SPARK_ARROW_SCHEMA_WITH_HEADERS",
    "OffsetOracle",
    "change_table",
    "consumer_config",
    "iter_range",
    "spark_batch",
    "split_ranges",
]

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
#: ``includeHeaders``: Spark's ``array<struct<key: string, value: binary>>``, null without headers.
HEADERS_ARROW = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
SPARK_ARROW_SCHEMA_WITH_HEADERS = SPARK_ARROW_SCHEMA.append(pa.field("headers", HEADERS_ARROW))
_UNKNOWN_TOPIC = (RdKafkaError.UNKNOWN_TOPIC_OR_PART, RdKafkaError._UNKNOWN_TOPIC)
_T = TypeVar("_T")
_P = TypeVar("_P", int, tuple[str, int])

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
_HEADERS = Message.headers


def consumer_config(opts: KafkaSourceOptions, **overrides: Any) -> dict[str, Any]:
    """Our tuning, then the user's librdkafka properties, then what correctness requires.

    ``group.id`` is only there because librdkafka requires one: partitions are assigned, no group
    is joined and nothing is committed (``kafka.group.id`` and ``groupIdPrefix`` name it)."""
    prefix = opts.group_id_prefix or "statesnap-spark"
    conf: dict[str, Any] = {
        "bootstrap.servers": opts.bootstrap_servers,
        "client.id": "statesnap-spark",
        "group.id": f"{prefix}-{opts.topic}",
    }
    conf.update(_TUNING)
    conf.update(opts.kafka_config)
    conf.update(_REQUIRED)
    conf.update(overrides)
    return conf


class OffsetOracle:
    """Driver-side answers about the subscribed partitions: which exist, earliest offsets, true
    end offsets and offsets by timestamp.

    Keeps one admin client for its lifetime (a streaming source asks every trigger); call
    :meth:`close` when done. Every request is tried ``fetchOffset.numRetries``
    times, ``fetchOffset.retryIntervalMs`` apart, as Spark's source does. ``partitions``/
    ``earliest``/``latest`` answer for ``opts.topic`` by partition number; the ``*_of`` methods
    for ``(topic, partition)`` pairs of any subscription.
    """

    def __init__(self, opts: KafkaSourceOptions, *, admin: Any | None = None) -> None:
        self.opts = opts
        self._timeout = opts.metadata_timeout_ms / 1000
        self._admin = admin
        #: What librdkafka said about the admin client's connections (none for a given admin).
        self._errors: ConnectionErrors | None = None
        #: Highest end seen per partition: ends only go backwards when a log shrinks.
        self._known_ends: dict[TP, int] = {}

    @property
    def admin(self) -> Any:
        if self._admin is None:
            self._admin, self._errors = new_watched_admin(self.opts.settings())
        return self._admin

    def _unreachable(self, what: str, e: Exception | None = None) -> BrokerUnavailableError:
        """The one line for a request that got no answer: the cause librdkafka saw (wrong
        password, certificate not trusted, a TLS client on a plaintext listener) in the words
        the CLI uses (:class:`~statesnap.kafka.clients.ConnectionErrors`), else its own reason."""
        hint = ""
        if self._errors is not None and self._admin is not None:
            self._admin.poll(0)  # librdkafka queues its connection errors for poll()
            hint = self._errors.hint()
        # "Local: Broker transport failure" says nothing the cause does not say better.
        detail = f": {_reason(e)}" if e is not None and _reason(e) and not hint else ""
        return BrokerUnavailableError(
            f"option kafka.bootstrap.servers: cannot {what} at {self.opts.bootstrap_servers} "
            f"within {self._timeout:g}s{detail}{hint}"
        )

    def _retrying(self, call: Callable[[], _T]) -> _T:
        attempts = max(1, self.opts.fetch_retries)
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except (BrokerUnavailableError, KafkaError) as e:
                if attempt == attempts or isinstance(e, TopicNotFoundError):
                    raise
                log.info("attempt %d/%d failed (%s); retrying", attempt, attempts, e)
                time.sleep(self.opts.fetch_retry_interval_ms / 1000)
        raise AssertionError("unreachable")  # pragma: no cover

    def topics(self) -> dict[str, tuple[int, ...]]:
        """Every topic of the cluster with its partitions (one metadata request for all topics:
        naming a missing one would make brokers with auto-creation create it)."""

        def call() -> dict[str, tuple[int, ...]]:
            try:
                md = self.admin.list_topics(timeout=self._timeout)
            except KafkaException as e:
                raise self._unreachable("list topics", e) from e
            return {name: tuple(sorted(t.partitions)) for name, t in md.topics.items() if t.partitions}

        return self._retrying(call)

    def topic_partitions(self, *, missing_ok: bool = False) -> tuple[TP, ...]:
        """The subscription's partitions now. A subscribed topic or assigned partition that does
        not exist is a :class:`TopicNotFoundError` naming the option, unless *missing_ok*
        (a streaming query then treats it as gone)."""
        sub = self.opts.strategy
        topics = self.topics()
        if sub.kind == "subscribePattern":
            return tuple((t, p) for t in sorted(topics) if sub.matches(t) for p in topics[t])
        if sub.kind == "subscribe":
            missing = [t for t in sub.topics if t not in topics]
            if missing and not missing_ok:
                raise TopicNotFoundError(
                    f"option subscribe: topic(s) {', '.join(map(repr, missing))} do not exist on "
                    f"{self.opts.bootstrap_servers}"
                )
            return tuple((t, p) for t in sub.topics if t in topics for p in topics[t])
        absent = [tp for tp in sub.assigned if tp[1] not in topics.get(tp[0], ())]
        if absent and not missing_ok:
            raise TopicNotFoundError(
                f"option assign: {', '.join(f'{t}[{p}]' for t, p in absent)} do not exist on "
                f"{self.opts.bootstrap_servers}"
            )
        return tuple(tp for tp in sub.assigned if tp not in absent)

    def partitions(self) -> tuple[int, ...]:
        """Partitions of ``opts.topic``; typed errors name the option that is wrong."""
        found = self.topics().get(self.opts.topic)
        if not found:
            raise TopicNotFoundError(
                f"option subscribe: topic {self.opts.topic!r} does not exist on {self.opts.bootstrap_servers}"
            )
        return found

    def earliest(self, partitions: Sequence[int]) -> dict[int, int]:
        """First offset still stored per partition of ``opts.topic``."""
        found = self.earliest_of([(self.opts.topic, p) for p in partitions])
        return {p: found[(self.opts.topic, p)] for p in partitions}

    def latest(self, partitions: Sequence[int]) -> dict[int, int]:
        """True end per partition of ``opts.topic`` (see :meth:`latest_of`)."""
        found = self.latest_of([(self.opts.topic, p) for p in partitions])
        return {p: found[(self.opts.topic, p)] for p in partitions}

    def _list_offsets(self, request: Mapping[TP, Any]) -> dict[TP, Any]:
        iso = IsolationLevel.READ_COMMITTED if self.opts.read_committed else IsolationLevel.READ_UNCOMMITTED
        tps = {TopicPartition(t, p): spec for (t, p), spec in request.items()}

        def call() -> dict[TP, Any]:
            try:
                futures = self.admin.list_offsets(tps, isolation_level=iso, request_timeout=self._timeout)
                return {
                    (tp.topic, tp.partition): f.result(timeout=self._timeout) for tp, f in futures.items()
                }
            except KafkaException as e:
                err: Any = e.args[0] if e.args else None
                if err is not None and err.code() in _UNKNOWN_TOPIC:
                    raise TopicNotFoundError(
                        f"option {self.opts.strategy.option}: {self.opts.strategy.describe()} "
                        f"disappeared while listing offsets: {err.str()}"
                    ) from e
                raise self._unreachable("list offsets", e) from e
            except Exception as e:  # a plain timeout from the future
                raise self._unreachable("list offsets", e) from e

        return self._retrying(call) if tps else {}

    def earliest_of(self, tps: Sequence[TP]) -> dict[TP, int]:
        """First offset still stored per partition (the low watermark is exact everywhere)."""
        found = self._list_offsets({tp: OffsetSpec.earliest() for tp in tps})  # type: ignore[no-untyped-call]
        return {tp: max(0, int(found[tp].offset)) for tp in tps}

    def offsets_for_times(self, wanted: Mapping[TP, int]) -> dict[TP, int | None]:
        """Per partition, the earliest offset whose timestamp is >= the given one (Kafka's
        ListOffsets by timestamp, what Java's ``offsetsForTimes`` sends); None where no record
        is that recent. The dev broker answers 0 for every timestamp."""
        specs = {tp: OffsetSpec.for_timestamp(ts) for tp, ts in wanted.items()}
        found = self._list_offsets(specs)
        return {tp: (int(found[tp].offset) if int(found[tp].offset) >= 0 else None) for tp in wanted}

    def latest_of(self, tps: Sequence[TP]) -> dict[TP, int]:
        """The end (next offset to be written) per partition, found by partition EOF.

        Probing starts at the larger of the reported end (exact on Kafka, too small on the dev
        broker) and the end seen last time, and reads to EOF. A partition whose log shrank
        (deleted and recreated) answers nothing past its end on the dev broker: it is probed
        again from the reported end, and its end goes backwards. On a partition that keeps
        receiving records faster than EOF can be seen, the probe settles after
        :data:`PROBE_SETTLE_SECONDS` on the last record it saw: any offset that exists is a valid
        end, only a promise of records that do not exist is not.
        """
        if not tps:
            return {}
        hints = {
            tp: max(0, int(r.offset))
            for tp, r in self._list_offsets(
                {tp: OffsetSpec.latest() for tp in tps}  # type: ignore[no-untyped-call]
            ).items()
        }
        starts = {tp: max(hints[tp], self._known_ends.get(tp, 0)) for tp in tps}
        suspicious = {tp for tp in tps if starts[tp] > hints[tp]}
        found = self._probe(starts, give_up=suspicious)
        again = {tp: hints[tp] for tp in suspicious if tp not in found}
        if again:
            found.update(self._probe(again, give_up=set()))
        for tp, end in found.items():
            if end < self._known_ends.get(tp, 0):
                log.warning(
                    "the end of %s[%d] went back from %d to %d", tp[0], tp[1], self._known_ends[tp], end
                )
            self._known_ends[tp] = end
        return {tp: found[tp] for tp in tps}

    def _probe(self, starts: Mapping[TP, int], *, give_up: set[TP]) -> dict[TP, int]:
        """Read each partition from its start offset to EOF; partitions in *give_up* that say
        nothing for a while are left out of the answer instead of failing it."""
        # A consumer per probe, never kept between calls: librdkafka 2.16 crashes (SIGSEGV) when
        # a topic a live consumer once read is deleted (seen on the dev broker), which would take
        # the streaming query's driver-side Python process down with it.
        consumer = Consumer(consumer_config(self.opts))
        best: dict[TP, int] = {}
        pending, seen = set(starts), set[TP]()
        consumer.assign([TopicPartition(t, p, off) for (t, p), off in starts.items()])
        began = time.monotonic()
        try:
            while pending:
                waited = time.monotonic() - began
                if waited > PROBE_SETTLE_SECONDS:
                    pending -= seen
                    if waited > 2 * PROBE_SETTLE_SECONDS and pending <= give_up:
                        break
                    if not pending:
                        break
                if waited > self._timeout:
                    raise BrokerUnavailableError(
                        f"option kafka.bootstrap.servers: no end-of-partition answer for "
                        f"{sorted(pending)} from {self.opts.bootstrap_servers} within {self._timeout:g}s"
                    )
                msg: Any
                for msg in consumer.consume(BATCH_SIZE, _PROBE_POLL):
                    err = msg.error()
                    tp = (msg.topic(), msg.partition())
                    if err is None:
                        best[tp] = max(best.get(tp, 0), msg.offset() + 1)
                        seen.add(tp)
                    elif err.code() == RdKafkaError._PARTITION_EOF:
                        best[tp] = max(best.get(tp, 0), int(msg.offset()))
                        pending.discard(tp)
                        seen.add(tp)
                    else:
                        _raise_or_warn(err, self.opts, tp[1], tp[0])
        except KafkaException as e:
            raise KafkaError(f"probing the end of {self.opts.strategy.describe()}: {e}") from e
        finally:
            consumer.close()
        # Offsets below the start mean the consumer was reset to the log start: the log shrank.
        return {tp: (best[tp] if best[tp] < starts[tp] else max(best[tp], starts[tp])) for tp in seen}

    def close(self) -> None:
        self._admin = None
        self._errors = None


def _reason(e: Exception) -> str:
    """librdkafka's message alone (``Local: Timed out``), not the ``KafkaError{code=…}`` repr."""
    err = e.args[0] if isinstance(e, KafkaException) and e.args else None
    return str(err.str()) if err is not None and hasattr(err, "str") else str(e)


def _raise_or_warn(err: Any, opts: KafkaSourceOptions, partition: int, topic: str | None = None) -> None:
    code = err.code()
    topic = topic or opts.topic
    if is_fatal(err):  # by flag or by code (statesnap.kafka.fatal)
        raise fatal_error(err, f"reading {topic!r}[{partition}]", opts.bootstrap_servers)
    if code == RdKafkaError._ALL_BROKERS_DOWN:
        raise BrokerUnavailableError(
            f"option kafka.bootstrap.servers: lost {opts.bootstrap_servers} while reading "
            f"{topic!r}[{partition}]: {err.str()}"
        )
    if code in _UNKNOWN_TOPIC:
        raise TopicNotFoundError(f"option {opts.strategy.option}: topic {topic!r} disappeared: {err.str()}")
    log.warning("Kafka error on %s[%d]: %s", topic, partition, err.str())


def iter_range(
    opts: KafkaSourceOptions, partition: int, start: int, end: int, *, topic: str | None = None
) -> Iterator[list[Any]]:
    """Every message of ``[start, end)`` of one partition (of *topic*, default ``opts.topic``),
    in offset order, in large batches.

    Ends at the range's last offset, or at an EOF at/after *end* (gaps such as transaction markers
    at the end of a range). Records the range promises but that do not arrive within
    ``kafkaConsumer.pollTimeoutMs`` fail the task instead of hanging it. Offsets deleted before
    they were read fail it too under ``failOnDataLoss`` (else the read goes on at the log start).
    """
    if end <= start:
        return
    topic = topic or opts.topic
    consumer = Consumer(consumer_config(opts))
    tp = TopicPartition(topic, partition, start)
    try:
        if start > 0:
            low, _high = consumer.get_watermark_offsets(
                tp, timeout=opts.metadata_timeout_ms / 1000, cached=False
            )
            if start < low:
                if opts.fail_on_data_loss:
                    raise DataLossError(
                        f"{topic}[{partition}]: offsets {start}..{low - 1} were deleted before they "
                        "were read (failOnDataLoss=true); set failOnDataLoss=false to skip them"
                    )
                log.warning("%s[%d]: skipping deleted offsets %d..%d", topic, partition, start, low - 1)
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
                        f"{topic}[{partition}]: no records for {timeout:g}s while reading "
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
                        _raise_or_warn(err, opts, partition, topic)
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
        raise KafkaError(f"reading {topic}[{partition}]: {e}") from e
    finally:
        consumer.close()


def _timestamps(msgs: list[Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(librdkafka timestamp types, timestamps in ms) of *msgs*, flattened in one C-level pass."""
    n = len(msgs)
    pairs = np.fromiter(chain.from_iterable(map(_TIMESTAMP, msgs)), np.int64, 2 * n).reshape(n, 2)
    return pairs[:, 0].astype(np.int32), pairs[:, 1]


def spark_batch(msgs: list[Any], topic: str, partition: int, *, headers: bool = False) -> pa.RecordBatch:
    """Messages as one Arrow batch in Spark's Kafka schema (column-wise, no per-row objects).

    ``timestampType`` follows Kafka's Java ids (0 create time, 1 log-append time, -1 none);
    a missing timestamp is null. With *headers*, a ``headers`` column as Spark's
    ``includeHeaders`` gives it: ``[{key, value}, …]`` in record order, null for no headers.
    """
    n = len(msgs)
    types, millis = _timestamps(msgs)
    missing = types == 0
    extra = [_headers_array(msgs)] if headers else []
    return pa.RecordBatch.from_arrays(
        [
            pa.array(list(map(_KEY, msgs)), pa.binary()),
            pa.array(list(map(_VALUE, msgs)), pa.binary()),
            pa.DictionaryArray.from_arrays(np.zeros(n, np.int8), [topic]).dictionary_decode(),
            pa.array(np.full(n, partition, np.int32)),
            pa.array(np.fromiter(map(_OFFSET, msgs), np.int64, n)),
            pa.array(millis * 1000, pa.timestamp("us", tz="UTC"), mask=missing if missing.any() else None),
            pa.array(types - 1),
            *extra,
        ],
        schema=SPARK_ARROW_SCHEMA_WITH_HEADERS if headers else SPARK_ARROW_SCHEMA,
    )


def _headers_array(msgs: list[Any]) -> pa.Array:
    rows = [None if not h else [{"key": kv[0], "value": kv[1]} for kv in h] for h in map(_HEADERS, msgs)]
    return pa.array(rows, HEADERS_ARROW)


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
            pa.array(millis, datafile.TIMESTAMP, mask=missing if missing.any() else None),
        ],
        schema=datafile.SCHEMA,
    )
    if keys.null_count:
        table = table.filter(pc.is_valid(keys))
    return table


def split_ranges(
    ranges: Mapping[_P, tuple[int, int]],
    *,
    min_partitions: int | None,
    max_records: int | None,
    min_split: int = 1,
) -> list[tuple[_P, int, int]]:
    """Cut per-partition ``[start, end)`` ranges into ``(partition, start, end)`` splits
    (partitions are numbers, or ``(topic, partition)`` pairs).

    Ranges longer than *max_records* are cut; then, while there are fewer splits than
    *min_partitions*, the biggest splits are halved (never below *min_split* records), so every
    core gets work even when the topic has fewer partitions than the cluster has cores.
    """
    pieces: list[tuple[_P, int, int]] = []
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


def _cut(partition: _P, start: int, end: int, n: int) -> list[tuple[_P, int, int]]:
    bounds = [start + (end - start) * i // n for i in range(n + 1)]
    return [(partition, a, b) for a, b in pairwise(bounds) if b > a]
