"""Reading a changelog from given offsets, without a consumer group, until partition EOF.

"Caught up" is decided by librdkafka's partition-EOF event, not by the high watermark: the dev
broker under-reports watermarks, and EOF is also exact on Apache Kafka.

Nothing here waits forever. librdkafka retries a lost cluster silently (its "all brokers down"
goes to ``error_cb``, never to ``consume()``), and a fetch beyond a partition's end either returns
nothing (the dev broker) or is reset (Apache Kafka). So the reader watches its own progress: a
reader that is still catching up and has seen neither a record nor an EOF for ``stall_timeout``
seconds asks the cluster for metadata and raises :class:`BrokerUnavailableError` if it does not
answer; a next offset beyond the log end raises :class:`OffsetOutOfRangeError`. A next offset
below the log start (retention deleted records before they were read) is skipped to the log start
once the reader has been caught up, as a full replay would; before that — while it continues a
checkpoint — it raises :class:`RecordsDeletedError`, since the checkpoint plus a tail with a hole
in it is a table no replay could produce.

Leader epochs (KIP-320). Every position a record moved carries that record's leader epoch (a
:class:`~statesnap.checkpoint.manifest.NextOffset`), so checkpoints keep it; a reader assigned at
such a position has librdkafka ask the leader where that epoch ends before it fetches. A log an
unclean leader election (or a lone broker's recovery) truncated below the position, with later
records at the lost offsets, is then reported instead of read past: an
:class:`OffsetOutOfRangeError` saying so (:func:`log_truncated`), handled as any offset the log no
longer holds. A broker without epochs (the dev broker writes 0 and checks nothing) reads as before.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping
from itertools import groupby
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from statesnap.checkpoint.manifest import NextOffset, leader_epoch_of
from statesnap.deadline import Deadline
from statesnap.errors import (
    BrokerUnavailableError,
    KafkaError,
    LogTruncatedError,
    OffsetOutOfRangeError,
    RecordsDeletedError,
)
from statesnap.kafka.clients import new_consumer
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.fatal import FatalErrors, FatalLogLines, fatal_error, is_fatal
from statesnap.kafka.outages import BrokerOutages, metadata_answers

__all__ = [
    "BATCH_SIZE",
    "FETCH_WAIT_MS",
    "OUT_OF_RANGE_GRACE",
    "PROBE_TIMEOUT",
    "ChangelogReader",
    "assign_checked",
    "assignment",
    "cached_high",
    "epoch_end_offsets",
    "log_truncated",
    "resume_after_lost_offsets",
    "watermarks",
]

log = logging.getLogger(__name__)

#: Records fetched per consume() call; large batches amortize the Python per-call cost.
BATCH_SIZE = 10_000
#: Without a short fetch wait, every end-of-data probe costs the broker's default (500 ms+).
FETCH_WAIT_MS = 10
#: A position beyond the fetched high watermark must persist this long before it is called out of
#: range: right after a leader change Kafka's new leader may report a high watermark that lags.
OUT_OF_RANGE_GRACE = 1.0
#: Upper bound of the metadata probe that tells a lost cluster from a slow one.
PROBE_TIMEOUT = 5.0
#: Upper bound of the metadata fetched before assigning partitions read from their beginning
#: (see :func:`assign_checked`): past it, the assignment goes ahead the slow way.
METADATA_PRIME_TIMEOUT = 1.0
_CLUSTER_DOWN = (RdKafkaError._ALL_BROKERS_DOWN, RdKafkaError._TRANSPORT, RdKafkaError._RESOLVE)
#: librdkafka's offset reset after an epoch check failed names the epoch's end on the leader.
_EPOCH_END_RE = re.compile(r"broker end offset is (-?\d+)")


class ChangelogReader:
    """Consumes *topic* from per-partition next offsets; never commits, never joins a group."""

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        offsets: Mapping[int, int],
        *,
        stall_timeout: float | None = None,
    ) -> None:
        """Assign *offsets* (partition → next offset to consume).

        ``stall_timeout`` (default ``settings.timeout``): how long a reader that is not caught up
        may go without a record or an EOF before it checks the cluster and gives up if it is gone.
        """
        self.settings = settings
        self.topic = topic
        self.positions: dict[int, int] = dict(offsets)
        #: Where reading started: a partition that started past 0 continues a checkpoint.
        self._start: dict[int, int] = dict(offsets)
        self.at_eof: set[int] = set()
        self.stall_timeout = settings.timeout if stall_timeout is None else stall_timeout
        self._eof_offset: dict[int, int] = {}
        #: Per partition, (next offset, leader epoch) after the last batch poll() returned: applied()
        #: gives the position that epoch when the caller applied the whole batch.
        self._batch_end: dict[int, tuple[int, int | None]] = {}
        #: High watermarks as last seen by the consuming thread; a Consumer serves one thread at a
        #: time, so lag() reads these instead of calling into the consumer.
        self._high: dict[int, int] = {}
        self._last_progress = time.monotonic()
        #: librdkafka's last word on the cluster being unreachable since the last progress.
        self._cluster_error: str | None = None
        self._beyond_since: dict[int, float] = {}
        self._eof_seen = False
        #: Set by the owner once its restore is over: from then on a silent cluster is waited
        #: for, with a warning, instead of given up on (a running table keeps serving its rows
        #: through an outage and resumes when the cluster answers again).
        self.tailing = False
        #: A fatal error librdkafka reported to error_cb (inside consume()): poll() raises it.
        self.fatal = FatalErrors(f"consuming {topic!r}", settings.bootstrap_servers)
        #: Brokers error_cb said are unreachable: one of several is not the cluster.
        self._outages = BrokerOutages(settings.bootstrap_servers, log, f"consuming {topic!r}")
        user_cb = settings.config.get("error_cb")
        self._user_error_cb: Callable[[Any], None] | None = user_cb if callable(user_cb) else None
        #: Throughput tuning: the user's kafka_config wins over these (unlike the settings below,
        #: which the reader's correctness rests on).
        tuning: dict[str, Any] = {
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            # After an empty or partial fetch librdkafka backs off fetch.queue.backoff.ms
            # (default 1 s) before fetching again, idling the consumer most of the time
            # during catch-up: 5 ms measured 136 k → 925 k records/s on the dev broker.
            "fetch.queue.backoff.ms": 5,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024,
        }
        self._consumer = new_consumer(
            settings,
            **{k: v for k, v in tuning.items() if k not in settings.config},
            **{
                "group.id": f"statesnap-reader-{topic}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # Never jump silently: an offset outside the log is reported (see _handle_error)
                # instead of restarting at the beginning on top of a restored table.
                "auto.offset.reset": "error",
                "error_cb": self._on_client_error,
                **FatalLogLines.around(settings.client_config()),
                "isolation.level": "read_committed",
            },
        )
        self._answers = metadata_answers(self._consumer)
        self._assign()

    def _assign(self) -> None:
        assign_checked(self._consumer, self.topic, self.positions)

    def reassign(self, gained: Mapping[int, int], dropped: Collection[int] = ()) -> None:
        """Read *gained* (partition → next offset) too and *dropped* no more: the partitions a
        consumer group moved (a processor's other inputs follow its first input's assignment).
        Partitions kept continue from their positions."""
        for p in dropped:
            self.positions.pop(p, None)
            self._start.pop(p, None)
            self._eof_offset.pop(p, None)
            self._batch_end.pop(p, None)
            self._high.pop(p, None)
            self.at_eof.discard(p)
            self._beyond_since.pop(p, None)
        for p, offset in gained.items():
            self.positions[p] = self._start[p] = offset
            self.at_eof.discard(p)
            self._eof_offset.pop(p, None)
        self._progressed()
        self._assign()

    @property
    def caught_up(self) -> bool:
        return self.at_eof >= set(self.positions)

    def applied(self, partition: int, next_offset: int) -> None:
        """The caller applied a batch :meth:`poll` returned, up to *next_offset*. ``positions``
        move only here (and at a partition's end when :meth:`poll` delivered nothing more of it),
        so they never claim a record that is not in the store yet (another thread reads them for
        ``offsets`` and ``wait_for``; a checkpoint records them). A position at the end of the
        batch carries its last record's leader epoch."""
        end = self._batch_end.get(partition)
        epoch = end[1] if end is not None and end[0] == next_offset else None
        self.positions[partition] = NextOffset(next_offset, epoch) if epoch is not None else next_offset

    def poll(self, timeout: float = 0.5) -> dict[int, list[Any]]:
        """The next batch of messages grouped by partition, in offset order.

        Messages are confluent-kafka ``Message`` objects (see
        :class:`~statesnap.stores.base.KafkaMessage`); stores read them directly, so the hot path
        builds no intermediate tuples.
        """
        try:
            messages: list[Any] = self._consumer.consume(BATCH_SIZE, timeout)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if is_fatal(err):
                raise fatal_error(err, f"consuming {self.topic!r}", self.settings.bootstrap_servers) from e
            raise KafkaError(f"consuming {self.topic!r} from {self.settings.bootstrap_servers}: {e}") from e
        self.fatal.raise_if_any()
        self._report_outages()
        ended: dict[int, int] = {}
        # (``list.count(None)`` would compare each KafkaError to None, which it cannot do cleanly)
        if not [m for m in messages if m.error() is not None]:  # records only: the usual batch
            batches = group_by_partition(messages, [m.partition() for m in messages])
        else:
            batches = {}
            current_p = -1
            current: list[Any] = []
            # Messages arrive in runs of one partition: look the list up once per run.
            for msg in messages:
                if msg.error() is not None:
                    if msg.error().code() == RdKafkaError._PARTITION_EOF:
                        ended[msg.partition()] = msg.offset()
                    self._handle_error(msg.error(), msg)
                    current_p = -1
                    continue
                p = msg.partition()
                if p != current_p:
                    current = batches.setdefault(p, [])
                    current_p = p
                current.append(msg)
        for p, end in ended.items():
            # At its end with nothing more delivered, everything below the end is applied: the
            # position moves there even without a record (a partition whose records retention
            # deleted starts at its log start; transaction markers take offsets of their own), so
            # a checkpoint says where this partition's log really continues.
            if p not in batches and end > self.positions.get(p, 0):
                self.positions[p] = NextOffset(end, self._epoch_at(p, end))
        for p, msgs in batches.items():
            self._batch_end[p] = (msgs[-1].offset() + 1, msgs[-1].leader_epoch())
            if msgs[-1].offset() >= self._eof_offset.get(p, -1):
                self.at_eof.discard(p)
            high = cached_high(self._consumer, self.topic, p)
            if high is not None:
                self._high[p] = high
        if batches or self._eof_seen:
            self._eof_seen = False
            self._progressed()
        elif not self.caught_up:
            self._check_waiting()
        return batches

    def _epoch_at(self, partition: int, offset: int) -> int | None:
        """The leader epoch librdkafka's position of *partition* has at *offset* (a position an
        end-of-partition moved past transaction markers: the markers' epoch), or None."""
        try:
            (tp,) = self._consumer.position([TopicPartition(self.topic, partition)])
        except (KafkaException, ValueError):
            return None
        epoch = getattr(tp, "leader_epoch", None)
        return int(epoch) if tp.offset == offset and epoch is not None else None

    def _progressed(self) -> None:
        self._last_progress = time.monotonic()
        self._beyond_since.clear()

    def _cluster_answers(self) -> None:
        """An EOF or a metadata answer came from the cluster (queued records may not have)."""
        if self._cluster_error is not None:
            log.info("Kafka cluster at %s answers again", self.settings.bootstrap_servers)
            self._cluster_error = None
            self._outages.forget()

    def _waiting_for(self) -> list[int]:
        return sorted(set(self.positions) - self.at_eof)

    def _check_waiting(self) -> None:
        """No record and no EOF in this poll while partitions still wait for the log end."""
        now = time.monotonic()
        for p in self._waiting_for():
            high = cached_high(self._consumer, self.topic, p)
            pos = self.positions[p]
            if high is None or pos <= high:
                self._beyond_since.pop(p, None)
                continue
            since = self._beyond_since.setdefault(p, now)
            if now - since >= OUT_OF_RANGE_GRACE:
                raise OffsetOutOfRangeError(self.topic, p, pos, high, self.settings.bootstrap_servers)
        stalled = now - self._last_progress
        if stalled < self.stall_timeout:
            return
        probe_timeout = 1.0 if self._cluster_error else min(PROBE_TIMEOUT, max(1.0, self.stall_timeout))
        try:
            # All topics: naming one makes auto-creating brokers create a topic that was deleted.
            self._consumer.list_topics(timeout=probe_timeout)
        except KafkaException as e:
            reason = self._cluster_error or str(e.args[0].str() if e.args else e)
            if self.tailing:
                log.warning(
                    "no answer from the Kafka cluster at %s for %.0fs (%s); still serving what is "
                    "applied, waiting for it",
                    self.settings.bootstrap_servers,
                    stalled,
                    reason,
                )
                self._last_progress = now
                return
            raise BrokerUnavailableError(
                f"lost the Kafka cluster at {self.settings.bootstrap_servers}: no record and no "
                f"end-of-partition for {stalled:.0f}s on topic {self.topic!r} while partitions "
                f"{self._waiting_for()} still wait for the log end ({reason})"
            ) from e
        self._cluster_answers()
        log.warning(
            "no progress for %.0fs on topic %r partitions %s although the cluster at %s answers",
            stalled,
            self.topic,
            self._waiting_for(),
            self.settings.bootstrap_servers,
        )
        self._last_progress = now

    def _on_client_error(self, err: Any) -> None:
        """librdkafka's error_cb: called from consume() on the consuming thread. A fatal error is
        recorded for poll() to raise; brokers said to be down are checked by poll()."""
        if self.fatal.note(err) or self._outages.note(err):
            pass  # brokers down: poll() asks the cluster, then says which, or that none answers
        else:
            log.debug("Kafka client error at %s: %s", self.settings.bootstrap_servers, err.str())
        if self._user_error_cb is not None:
            self._user_error_cb(err)

    def _cluster_down(self, reason: str) -> None:
        if self._cluster_error is None:
            log.warning(
                "Kafka cluster at %s unreachable: no broker answers (%s); %s",
                self.settings.bootstrap_servers,
                reason,
                "waiting for it"
                if self.caught_up or self.tailing
                else f"giving up unless it answers within {self.stall_timeout:g}s",
            )
        self._cluster_error = reason

    def _report_outages(self) -> None:
        """Brokers error_cb named as unreachable: said once, with whether the others answer."""
        if self._cluster_error is not None:  # said already; an answer again is said too
            self._outages.discard()
            return
        down = self._outages.report(self._answers)
        if down is not None:
            self._cluster_down(down)

    def _handle_error(self, err: Any, msg: Any) -> None:
        code = err.code()
        if code == RdKafkaError._PARTITION_EOF:
            self.at_eof.add(msg.partition())
            self._eof_offset[msg.partition()] = msg.offset()
            self._eof_seen = True
            self._cluster_answers()
            return
        if code in (RdKafkaError._AUTO_OFFSET_RESET, RdKafkaError._LOG_TRUNCATION):
            self._offset_not_available(msg.partition(), err)
            return
        if is_fatal(err):
            raise fatal_error(err, f"consuming {self.topic!r}", self.settings.bootstrap_servers)
        if code in _CLUSTER_DOWN:
            self._on_client_error(err)
            return
        log.warning("Kafka error on %s: %s", self.topic, err.str())

    def _offset_not_available(self, p: int, err: Any) -> None:
        """The broker answered OFFSET_OUT_OF_RANGE, or the leader's epochs say the log was
        truncated below the position (see :func:`resume_after_lost_offsets`).

        A partition that continues a checkpoint and has not reached its end yet must not skip:
        records the checkpoint never saw would be missing from the table for good."""
        position = self.positions.get(p, 0)
        if self._start.get(p, 0) > 0 and p not in self._eof_offset:
            low, _high = watermarks(self._consumer, self.settings, self.topic, p)
            if position < low:
                raise RecordsDeletedError(self.topic, p, position, low, self.settings.bootstrap_servers)
        self.positions[p] = resume_after_lost_offsets(
            self._consumer, self.settings, self.topic, p, self.positions.get(p, 0), err.str()
        )
        self._assign()

    def lag(self) -> dict[int, int]:
        """Records behind per partition from the watermarks the consuming thread saw last; safe
        to call from any thread (it never touches the consumer)."""
        return {
            p: 0 if p in self.at_eof else max(0, self._high.get(p, pos) - pos)
            for p, pos in list(self.positions.items())
        }

    def close(self) -> None:
        self._consumer.close()


def cached_high(consumer: Any, topic: str, partition: int) -> int | None:
    """The partition's high watermark in *consumer*'s last fetch response (no request; exact,
    unlike a watermark query); None where unknown."""
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
    except KafkaException:
        return None
    return int(high) if high is not None and high >= 0 else None


#: Answers of a partition whose leadership is moving: a topic just created (the metadata names
#: a leader the broker has not taken up yet), a failover, a leader election. The Java client
#: retries ListOffsets on these; so do we, within the settings' timeout.
_LEADER_MOVING = frozenset(
    {
        RdKafkaError.NOT_LEADER_FOR_PARTITION,
        RdKafkaError.LEADER_NOT_AVAILABLE,
        RdKafkaError.REPLICA_NOT_AVAILABLE,
        RdKafkaError.FENCED_LEADER_EPOCH,
        RdKafkaError.UNKNOWN_LEADER_EPOCH,
        RdKafkaError.OFFSET_NOT_AVAILABLE,
    }
)
#: Pause between two asks while leadership moves (librdkafka refreshes its metadata meanwhile).
_LEADER_RETRY_PAUSE = 0.1


def watermarks(consumer: Any, settings: KafkaSettings, topic: str, partition: int) -> tuple[int, int]:
    """(log start, reported end) of one partition, asked of the broker; a broker that does not
    answer within the settings' timeout is a :class:`BrokerUnavailableError` naming it, and so is
    a partition whose leadership is still moving when the timeout is up (asked again until then)."""
    deadline = Deadline(settings.timeout)
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=deadline.remaining(), cached=False
            )
        except KafkaException as e:
            left = deadline.remaining()
            moving = bool(e.args) and e.args[0].code() in _LEADER_MOVING
            if moving and (left is None or left > 2 * _LEADER_RETRY_PAUSE):
                time.sleep(_LEADER_RETRY_PAUSE)
                continue
            waited = f" (its leader still moving after {settings.timeout:g} s)" if moving else ""
            raise BrokerUnavailableError(
                f"cannot read the offsets of {topic!r} [{partition}] from {settings.bootstrap_servers}"
                f"{waited}: {e}"
            ) from e
        return int(low), int(high)


def resume_after_lost_offsets(
    consumer: Any, settings: KafkaSettings, topic: str, partition: int, position: int, detail: str = ""
) -> int:
    """Where to continue when *position* is no longer in the log: below the log start (retention
    deleted records before they were read) at the log start, as a full replay would; at or past it
    the log was truncated under it (librdkafka's *detail* says so after an epoch check) or the
    offsets are another incarnation's (:class:`OffsetOutOfRangeError` either way)."""
    low, high = watermarks(consumer, settings, topic, partition)
    if position >= low and "truncation" in detail.lower():
        raise log_truncated(topic, partition, position, detail, settings.bootstrap_servers)
    if position >= low:
        raise OffsetOutOfRangeError(topic, partition, position, high, settings.bootstrap_servers)
    log.warning(
        "topic %r partition %d: offsets %d..%d were deleted by retention before they were read; "
        "continuing at %d%s",
        topic,
        partition,
        position,
        low - 1,
        low,
        f" ({detail})" if detail else "",
    )
    return low


def assignment(topic: str, partition: int, offset: int) -> TopicPartition:
    """Where a consumer fetches *partition* from: *offset* (the beginning for 0), with the leader
    epoch of the record before it where known, so the leader checks its log still holds that
    record before anything is fetched (KIP-320)."""
    if offset <= 0:
        return TopicPartition(topic, partition, OFFSET_BEGINNING)
    epoch = leader_epoch_of(offset)
    if epoch is None:
        return TopicPartition(topic, partition, int(offset))
    return TopicPartition(topic, partition, int(offset), leader_epoch=epoch)


def assign_checked(consumer: Any, topic: str, positions: Mapping[int, int]) -> None:
    """Assign *consumer* at *positions* and have the leader check the epoch of each that carries
    one before anything is fetched there. librdkafka checks an assigned epoch only when the
    partition's leader changes afterwards (as it does for a fresh consumer's first metadata; never
    in a rebalance callback, measured) but always on a seek, so those partitions are assigned
    paused, sought with their epoch and resumed (librdkafka 2.16, Apache Kafka 4.1.1: the seek is
    accepted right after the assignment, the answer comes with the first fetch, ~50 ms).

    A partition read from its beginning is a logical offset librdkafka must ask the leader to
    resolve; asked before the consumer knows the leader, it retries only after a fixed 500 ms
    (librdkafka 2.x, both brokers, measured: 0.52 s to the first end-of-partition, 0.10 s with the
    metadata fetched first). So the cluster's metadata is fetched first when any partition starts
    there; all topics, since naming one has auto-creating brokers create it. A cluster that does
    not answer within :data:`METADATA_PRIME_TIMEOUT` is left to the reader's own stall check."""
    if any(off <= 0 for off in positions.values()):
        try:
            consumer.list_topics(timeout=METADATA_PRIME_TIMEOUT)
        except KafkaException as e:
            log.debug("metadata before assigning %r from the beginning: %s", topic, e)
    consumer.assign([assignment(topic, p, off) for p, off in sorted(positions.items())])
    held = [
        assignment(topic, p, off) for p, off in sorted(positions.items()) if leader_epoch_of(off) is not None
    ]
    if not held:
        return
    try:
        consumer.pause(held)
        for tp in held:
            consumer.seek(tp)
    except KafkaException as e:  # fetching with librdkafka's own check beats not fetching
        log.debug("seek %r %s for the epoch check: %s", topic, [tp.partition for tp in held], e)
    finally:
        consumer.resume(held)


def _epoch_end(detail: str) -> int | None:
    match = _EPOCH_END_RE.search(detail)
    return int(match.group(1)) if match else None


def log_truncated(topic: str, partition: int, position: int, detail: str, address: str) -> LogTruncatedError:
    """The error for a position the leader's epochs say the log no longer leads to: truncated
    below it by an unclean leader election or a broker's recovery, later records at the lost
    offsets. A :class:`LogTruncatedError` (its ``log_end``: where the position's epoch ends), so a
    restore drops the checkpoint as for any offset the log no longer holds."""
    end = _epoch_end(detail)
    epoch = leader_epoch_of(position)
    if epoch is None:
        held = "the leader's epochs do not lead to it"
    elif end is None or end < 0:
        held = f"the log knows no leader epoch {epoch}"
    else:
        held = f"leader epoch {epoch} ends at offset {end}"
    return LogTruncatedError(
        topic, partition, int(position), end if end is not None and end >= 0 else None, address, held
    )


#: Poll timeout of the leader-epoch probe; an answer comes with the first fetch (~20 ms measured).
EPOCH_PROBE_POLL = 0.05


def epoch_end_offsets(
    settings: KafkaSettings, topic: str, positions: Mapping[int, NextOffset]
) -> dict[int, int]:
    """For each position whose log no longer holds its leader epoch up to it, where that epoch ends
    (-1: the log knows no such epoch); the :data:`~statesnap.checkpoint.selection.EpochEnds` of a
    restore. One consumer assigned at every position with its epoch: librdkafka asks the leader
    (OffsetForLeaderEpoch) and either fetches (the log is intact there: absent from the answer) or
    reports a truncation. Partitions undecided within ``settings.timeout`` are absent too (the
    restore's own reader is asked the same question); nothing is committed.

    Measured on Apache Kafka 4.1.1: one probe ~40 ms, truncation reported within ~20 ms."""
    if not positions:
        return {}
    found: dict[int, int] = {}
    pending = set(positions)
    consumer = new_consumer(
        settings,
        **{
            "group.id": f"statesnap-reader-{topic}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.queue.backoff.ms": 5,
        },
    )
    deadline = time.monotonic() + settings.timeout
    try:
        assign_checked(consumer, topic, positions)
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, EPOCH_PROBE_POLL):
                err, p = msg.error(), msg.partition()
                if is_fatal(err):
                    raise fatal_error(
                        err, f"probing the leader epochs of {topic!r}", settings.bootstrap_servers
                    )
                if p not in pending:
                    continue
                if err is None or err.code() == RdKafkaError._PARTITION_EOF:
                    pending.discard(p)
                elif err.code() in (RdKafkaError._AUTO_OFFSET_RESET, RdKafkaError._LOG_TRUNCATION):
                    pending.discard(p)  # out of range by offsets alone: judged elsewhere
                    if "truncation" in err.str().lower():
                        end = _epoch_end(err.str())
                        found[p] = -1 if end is None or end < 0 else end
    except KafkaException as e:
        log.warning(
            "cannot ask %s where the leader epochs of %r end: %s", settings.bootstrap_servers, topic, e
        )
    finally:
        consumer.close()
    if pending:
        log.info(
            "no answer within %gs on where the leader epochs of %r partitions %s end; judged by offsets",
            settings.timeout,
            topic,
            sorted(pending),
        )
    return found


def group_by_partition(messages: list[Any], partitions: list[int]) -> dict[int, list[Any]]:
    """*messages* (records, each of ``partitions[i]``) grouped by partition in their order: they
    arrive in runs of one partition, so whole runs are sliced off (no call per message)."""
    if not messages:
        return {}
    if partitions.count(partitions[0]) == len(partitions):
        return {partitions[0]: messages}
    batches: dict[int, list[Any]] = {}
    at = 0
    for p, run in groupby(partitions):
        end = at + len(list(run))
        batch = batches.get(p)
        if batch is None:
            batches[p] = messages[at:end]
        else:
            batch += messages[at:end]
        at = end
    return batches
