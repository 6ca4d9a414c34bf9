"""Reading a changelog as a member of a consumer group: partitions come and go at rebalances.

The group decides which partitions this member owns; where each one starts is statesnap's
business, never the group's committed offsets: a partition gained in a rebalance is restored from
the newest checkpoint by the :class:`RebalanceListener`, which answers with the offsets to resume
from. The offsets committed to the group (at commit points and on revocation) are informational,
for lag monitoring tools — unless an exactly-once processor's transactions commit them instead
(``informational_commits`` off; :mod:`statesnap.processor.transactions`).

Protocols. ``partition.assignment.strategy`` decides (default ``roundrobin``, eager: every
rebalance revokes everything, then assigns). ``cooperative-sticky`` moves only the partitions
that change owner; it needs a broker that completes the cooperative rounds promptly (Apache
Kafka does; the dev broker leaves moved partitions unassigned for many seconds, so it is not the
default). The KIP-848 protocol (``group.protocol=consumer``, Kafka 4.0+) is used as it is given:
the broker assigns, incrementally, with its own session and heartbeat settings (statesnap then
sets none of the classic protocol's); it never assigns on the dev broker.

Eager rebalances revoke partitions that often come straight back: a revoked partition is
*suspended* (its rows kept, readable, not consumed) until the assignment; if it comes back it
continues from its position, else it is dropped. A partition revoked cooperatively is dropped at
once; one *lost* (the session expired: another member may own it already) is dropped without
being handed over.

"Caught up" is partition EOF, as in :mod:`statesnap.kafka.reader`; positions carry leader epochs
as there (KIP-320): a gained partition whose checkpoint the log was truncated below is restored
again, judged against the log as it is now. An assignment made in a rebalance callback is not
checked against the leader's epochs (librdkafka 2.16 on Apache Kafka 4.1.1: it fetched from a
position of an epoch the log never had), a seek is: so a gained partition resuming at a position
with an epoch is assigned paused, and the next :meth:`GroupReader.poll` seeks it there with its
epoch, then resumes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, TopicPartition

from statesnap.checkpoint.manifest import NextOffset, leader_epoch_of
from statesnap.errors import KafkaError
from statesnap.kafka.clients import new_consumer
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.fatal import FatalErrors, FatalLogLines, fatal_error, is_fatal
from statesnap.kafka.outages import BrokerOutages, metadata_answers
from statesnap.kafka.reader import (
    BATCH_SIZE,
    FETCH_WAIT_MS,
    assignment,
    cached_high,
    log_truncated,
    resume_after_lost_offsets,
    watermarks,
)

__all__ = ["DEFAULT_SESSION_TIMEOUT_MS", "DEFAULT_STRATEGY", "GroupReader", "RebalanceListener"]

log = logging.getLogger(__name__)

#: Eager round-robin: balanced, and complete on the dev broker in one ~3 s round.
DEFAULT_STRATEGY = "roundrobin"
#: A dead member's partitions move after this long (Kafka's default is 45 s). 6 s is the lowest
#: session timeout Apache Kafka accepts by default, and the dev broker's joins take about half of
#: it (~23 s with 45 s).
DEFAULT_SESSION_TIMEOUT_MS = 6000
_CLUSTER_DOWN = (RdKafkaError._ALL_BROKERS_DOWN, RdKafkaError._TRANSPORT, RdKafkaError._RESOLVE)


class RebalanceListener(Protocol):
    """What the owner of a :class:`GroupReader` does at rebalances; called on the consuming
    thread, inside :meth:`GroupReader.poll` (or :meth:`GroupReader.close`)."""

    def partitions_gained(self, partitions: list[int]) -> Mapping[int, int]:
        """Restore *partitions*; return the next offset to consume for each."""
        ...

    def partitions_leaving(self, partitions: list[int]) -> None:
        """*partitions* are revoked: still owned and exact at the reader's positions (hand them
        over: commit, checkpoint). Their rows are dropped later, by :meth:`partitions_dropped`."""
        ...

    def partitions_dropped(self, partitions: list[int]) -> None:
        """*partitions* belong to another member now: forget their rows."""
        ...


class GroupReader:
    """Consumes *topic* as a member of consumer group *group*; see the module docstring.

    Read by the table like :class:`~statesnap.kafka.reader.ChangelogReader`: ``positions`` (next
    offset per partition consumed now), ``at_eof``, ``caught_up``, ``poll``, ``lag``, ``close``.
    """

    def __init__(self, settings: KafkaSettings, topic: str, group: str, listener: RebalanceListener) -> None:
        self.settings = settings
        self.topic = topic
        self.group = group
        self.listener = listener
        strategy = str(settings.config.get("partition.assignment.strategy", DEFAULT_STRATEGY))
        #: KIP-848's protocol: the broker assigns, always incrementally; the classic protocol's
        #: session, heartbeat and strategy settings are the broker's then (librdkafka refuses them).
        self.consumer_protocol = str(settings.config.get("group.protocol", "classic")).lower() == "consumer"
        self.cooperative = self.consumer_protocol or "cooperative" in strategy
        self.positions: dict[int, int] = {}
        self.at_eof: set[int] = set()
        #: Gained partitions that have not reached their end since (reads of them are refused).
        self.restoring: set[int] = set()
        #: Eager protocol: revoked partitions (next offset) until the assignment says where they go.
        self.suspended: dict[int, int] = {}
        #: Whether the group has given this member an assignment yet (possibly empty).
        self.assigned = False
        self.rebalances = 0
        #: Whether :meth:`commit` commits the positions (for lag tools). Off when a transactional
        #: producer commits the group's offsets with its outputs (exactly-once processors): the
        #: committed offsets then say which outputs are committed, and only it may move them.
        self.informational_commits = True
        self._eof_offset: dict[int, int] = {}
        #: Gained partitions assigned paused at a position with a leader epoch, to be sought there
        #: (which has the leader check the epoch) and resumed by the next poll().
        self._unchecked: set[int] = set()
        #: Per partition, (next offset, leader epoch) after the last batch poll() returned.
        self._batch_end: dict[int, tuple[int, int | None]] = {}
        self._high: dict[int, int] = {}
        #: Partitions revoked during the current consume() call: messages of theirs already
        #: collected into its batch are from before the revocation and must not be applied.
        self._revoked_in_call: set[int] = set()
        instance = settings.config.get("group.instance.id")
        #: What this member is, in a fatal error's message.
        self._doing = f"consuming {topic!r} in group {group!r}" + (
            f" as group.instance.id {instance!r}" if instance else ""
        )
        #: A fatal error librdkafka reported to error_cb (inside consume()): poll() raises it.
        self.fatal = FatalErrors(self._doing, settings.bootstrap_servers)
        #: Brokers error_cb said are unreachable: one of several is not the cluster.
        self._outages = BrokerOutages(settings.bootstrap_servers, log, self._doing)
        self._cluster_down = False
        defaults: dict[str, Any] = (
            {}
            if self.consumer_protocol
            else {
                "partition.assignment.strategy": DEFAULT_STRATEGY,
                "session.timeout.ms": DEFAULT_SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 1000,
            }
        )
        self._consumer = new_consumer(
            settings,
            **{k: v for k, v in defaults.items() if k not in settings.config},
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
                "fetch.wait.max.ms": FETCH_WAIT_MS,
                "fetch.queue.backoff.ms": 5,
                "isolation.level": "read_committed",
                "error_cb": self._on_client_error,
                **FatalLogLines.around(settings.client_config()),
            },
        )
        self._answers = metadata_answers(self._consumer)
        self._consumer.subscribe(
            [topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    # --- state ---------------------------------------------------------------------------------

    @property
    def caught_up(self) -> bool:
        """An assignment arrived and every partition consumed now is at its end."""
        return self.assigned and self.at_eof >= set(self.positions)

    @property
    def owned(self) -> set[int]:
        """Partitions whose rows this member holds: consumed now, or suspended in a rebalance."""
        return set(self.positions) | set(self.suspended)

    def readable(self, partition: int) -> bool:
        """Whether reads of *partition* are served: owned, and not still being restored."""
        return (
            partition in self.positions or partition in self.suspended
        ) and partition not in self.restoring

    # --- rebalance callbacks (on the consuming thread) -----------------------------------------

    def _ours(self, parts: list[Any]) -> list[int]:
        return sorted(tp.partition for tp in parts if tp.topic == self.topic)

    def _on_assign(self, consumer: Any, parts: list[Any]) -> None:
        new = self._ours(parts)
        kept = [p for p in new if p in self.suspended]
        gone = sorted(set(self.suspended) - set(new))
        if gone:
            self.restoring.difference_update(gone)  # a restore cut short by the rebalance ends here
            self.listener.partitions_dropped(gone)
        for p in kept:
            self.positions[p] = self.suspended[p]
        self.suspended.clear()
        gained = [p for p in new if p not in kept and p not in self.positions]
        if gained:
            offsets = self.listener.partitions_gained(gained)
            for p in gained:
                self.positions[p] = offsets[p]
                self.restoring.add(p)
        for p in new:
            self.at_eof.discard(p)
        tps = [self._start(p) for p in new]
        if self.cooperative:
            consumer.incremental_assign(tps)
        else:
            consumer.assign(tps)
        self._hold_for_epoch_check(gained)
        self.assigned = True
        self.rebalances += 1
        log.info(
            "group %s: assigned %s of %r (gained %s, kept %s, dropped %s)",
            self.group,
            new,
            self.topic,
            gained,
            kept,
            gone,
        )

    def _hold_for_epoch_check(self, partitions: list[int]) -> None:
        """Pause those of *partitions* whose position carries a leader epoch until poll() seeks
        them (see the module docstring): nothing is fetched from a position before it is checked."""
        held = [p for p in partitions if leader_epoch_of(self.positions[p]) is not None]
        if not held:
            return
        try:
            self._consumer.pause([TopicPartition(self.topic, p) for p in held])
        except KafkaException as e:
            log.debug("pause %s %s for the epoch check: %s", self.topic, held, e)
            return
        self._unchecked.update(held)

    def _check_epochs(self) -> None:
        """Seek every held partition to its position with its epoch, then resume it: the leader
        answers a log truncated below the position with an offset reset (see
        :meth:`_offset_not_available`) before any record is fetched."""
        held = sorted(self._unchecked & set(self.positions))
        self._unchecked.clear()
        for p in held:
            try:
                self._consumer.seek(self._start(p))
            except KafkaException as e:  # fetching unchecked beats not fetching at all
                log.debug("seek %s [%d] to %s for the epoch check: %s", self.topic, p, self.positions[p], e)
        if held:
            self._consumer.resume([TopicPartition(self.topic, p) for p in held])

    def _start(self, p: int) -> TopicPartition:
        """Where *p* is fetched from: its position, with the leader epoch it carries."""
        return assignment(self.topic, p, self.positions[p])

    def _on_revoke(self, consumer: Any, parts: list[Any]) -> None:
        revoked = [p for p in self._ours(parts) if p in self.positions]
        self._revoked_in_call.update(revoked)
        if revoked:
            self.listener.partitions_leaving(revoked)
            self.commit(revoked, asynchronous=False)
        for p in revoked:
            pos = self.positions.pop(p)
            self.at_eof.discard(p)
            if self.cooperative:
                self.restoring.discard(p)
            else:
                self.suspended[p] = pos
        if self.cooperative:
            if revoked:
                self.listener.partitions_dropped(revoked)
            consumer.incremental_unassign(parts)
        else:
            consumer.unassign()
        log.info("group %s: revoked %s of %r", self.group, revoked, self.topic)

    def _on_lost(self, consumer: Any, parts: list[Any]) -> None:
        lost = sorted(set(self._ours(parts)) & self.owned)
        self._revoked_in_call.update(lost)
        for p in lost:
            self.positions.pop(p, None)
            self.suspended.pop(p, None)
            self.at_eof.discard(p)
            self.restoring.discard(p)
        if lost:
            self.listener.partitions_dropped(lost)
        if self.cooperative:
            consumer.incremental_unassign(parts)
        else:
            consumer.unassign()
        log.warning("group %s: lost %s of %r (session expired); dropped", self.group, lost, self.topic)

    # --- consuming -----------------------------------------------------------------------------

    def applied(self, partition: int, next_offset: int) -> None:
        """The caller applied a batch :meth:`poll` returned, up to *next_offset*. ``positions``
        move only here, so they never claim a record that is not in the store yet (another
        thread reads them for ``offsets`` and ``wait_for``; a checkpoint records them). A position
        at the end of the batch carries its last record's leader epoch."""
        end = self._batch_end.get(partition)
        epoch = end[1] if end is not None and end[0] == next_offset else None
        self.positions[partition] = NextOffset(next_offset, epoch) if epoch is not None else next_offset

    def poll(self, timeout: float = 0.5) -> dict[int, list[Any]]:
        """The next batch of messages of owned partitions, grouped by partition, in offset order;
        rebalance callbacks run in here."""
        self._revoked_in_call = set()
        try:
            if self._unchecked:
                self._check_epochs()
            messages: list[Any] = self._consumer.consume(BATCH_SIZE, timeout)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if is_fatal(err):
                raise fatal_error(err, self._doing, self.settings.bootstrap_servers) from e
            raise KafkaError(f"consuming {self.topic!r} from {self.settings.bootstrap_servers}: {e}") from e
        self.fatal.raise_if_any()  # the fenced member gets no partitions: it must not idle
        down = None if self._cluster_down else self._outages.report(self._answers)
        if self._cluster_down:
            self._outages.discard()  # said already; an answer again is said too
        if down is not None:
            self._say_cluster_down(down)
        elif self._cluster_down and any(
            m.error() is None or m.error().code() == RdKafkaError._PARTITION_EOF for m in messages
        ):
            log.info(
                "group %s: the Kafka cluster at %s answers again", self.group, self.settings.bootstrap_servers
            )
            self._cluster_down = False
            self._outages.forget()
        stale = self._revoked_in_call
        batches: dict[int, list[Any]] = {}
        for msg in messages:
            p = msg.partition()
            if msg.error() is not None:
                self._handle_error(msg.error(), msg, stale)
                continue
            if p in stale or p not in self.positions or msg.offset() < self.positions[p]:
                continue
            batches.setdefault(p, []).append(msg)
        for p, msgs in batches.items():
            self._batch_end[p] = (msgs[-1].offset() + 1, msgs[-1].leader_epoch())
            if msgs[-1].offset() >= self._eof_offset.get(p, -1):
                self.at_eof.discard(p)
            self._note_high(p)
        for p in stale & set(self.positions):
            self._seek(p)  # revoked and assigned again within one call: refetch from our position
        return batches

    def _note_high(self, p: int) -> None:
        high = cached_high(self._consumer, self.topic, p)
        if high is not None:
            self._high[p] = high

    def _seek(self, p: int) -> None:
        try:
            self._consumer.seek(self._start(p))
        except KafkaException as e:
            log.debug("seek %s [%d] to %d: %s", self.topic, p, self.positions[p], e)

    def _handle_error(self, err: Any, msg: Any, stale: set[int]) -> None:
        code = err.code()
        p = msg.partition()
        if code == RdKafkaError._PARTITION_EOF:
            if p in self.positions and p not in stale and msg.offset() >= self.positions[p]:
                self.at_eof.add(p)
                self._eof_offset[p] = msg.offset()
                self.restoring.discard(p)
            return
        if code in (RdKafkaError._AUTO_OFFSET_RESET, RdKafkaError._LOG_TRUNCATION) and p in self.positions:
            self._offset_not_available(p, err.str())
            return
        if is_fatal(err):
            raise fatal_error(err, self._doing, self.settings.bootstrap_servers)
        if code in _CLUSTER_DOWN:
            self._on_client_error(err)
            return
        log.warning("Kafka error on %s (group %s): %s", self.topic, self.group, err.str())

    def _offset_not_available(self, p: int, detail: str = "") -> None:
        """See :func:`~statesnap.kafka.reader.resume_after_lost_offsets`.

        A partition still being restored from a checkpoint must not skip: records that checkpoint
        never saw would be missing for good. Retention moved the log start past it after it was
        chosen, or the log was truncated below it (the leader's epochs say so, *detail*), so its
        rows are dropped and it is restored again, judged against the log as it is now (an older
        usable checkpoint, or a replay of what the log holds). A restore that lands on the same
        truncated position again, or a truncation under a partition already caught up, raises."""
        position = self.positions[p]
        if p in self.restoring and position > 0:
            low, _high = watermarks(self._consumer, self.settings, self.topic, p)
            truncated = position >= low and "truncation" in detail.lower()
            if position < low or truncated:
                what = (
                    f"the log was truncated below offset {position} (an unclean leader election: {detail})"
                    if truncated
                    else f"retention deleted offsets {position}..{low - 1} before its restore read them"
                )
                log.warning(
                    "group %s: %r partition %d: %s; restoring the partition again",
                    self.group,
                    self.topic,
                    p,
                    what,
                )
                self.listener.partitions_dropped([p])
                again = self.listener.partitions_gained([p])[p]
                if truncated and (again, leader_epoch_of(again)) == (position, leader_epoch_of(position)):
                    # the same position chosen again: nothing older escapes the truncation
                    raise log_truncated(self.topic, p, position, detail, self.settings.bootstrap_servers)
                self.positions[p] = again
                self.at_eof.discard(p)
                self._refetch(p)
                return
        self.positions[p] = resume_after_lost_offsets(
            self._consumer, self.settings, self.topic, p, self.positions[p], detail
        )
        self._refetch(p)

    def _refetch(self, p: int) -> None:
        """Fetch *p* again from its position after an offset-reset error. librdkafka refuses to
        seek such a partition ("Erroneous state": the member then waited forever, proven on
        Apache Kafka); assigning it again restarts its fetcher (held for the epoch check as a
        gained partition is)."""
        try:
            if self.cooperative:
                self._consumer.incremental_unassign([TopicPartition(self.topic, p)])
                self._consumer.incremental_assign([self._start(p)])
            else:
                self._consumer.assign([self._start(q) for q in sorted(self.positions)])
        except KafkaException as e:
            raise KafkaError(
                f"cannot resume {self.topic!r} partition {p} in group {self.group!r} at "
                f"{self.positions[p]} on {self.settings.bootstrap_servers}: {e}"
            ) from e
        self._hold_for_epoch_check([p])

    def _on_client_error(self, err: Any) -> None:
        """librdkafka's error_cb, on the consuming thread inside consume(): a fatal error is
        recorded for poll() to raise (logged by whoever reports the task's failure); one broker
        down is said by poll(), with whether the others answer."""
        if self.fatal.note(err) or self._outages.note(err):
            pass
        else:
            log.debug(
                "Kafka client error (group %s) at %s: %s",
                self.group,
                self.settings.bootstrap_servers,
                err.str(),
            )
        user_cb = self.settings.config.get("error_cb")
        if callable(user_cb):
            user_cb(err)

    def _say_cluster_down(self, reason: str) -> None:
        if not self._cluster_down:
            log.warning(
                "group %s: Kafka cluster at %s unreachable: no broker answers (%s); waiting for it",
                self.group,
                self.settings.bootstrap_servers,
                reason,
            )
        self._cluster_down = True

    # --- the group's offsets (informational) ---------------------------------------------------

    def commit(self, partitions: list[int] | None = None, *, asynchronous: bool = True) -> None:
        """Commit our positions to the group, for lag monitoring; never read back by statesnap."""
        if not self.informational_commits:
            return
        parts = sorted(self.positions) if partitions is None else partitions
        offsets = [self._start(p) for p in parts if self.positions.get(p, 0) > 0]  # with their epochs
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as e:
            log.debug("group %s: offset commit failed (informational only): %s", self.group, e)

    def group_metadata(self) -> Any:
        """This member's consumer group metadata (member id, generation): a transactional
        producer sends it with the offsets it commits, so the group coordinator fences a member
        a rebalance has replaced (KIP-447)."""
        return self._consumer.consumer_group_metadata()

    def log_start(self, partitions: list[int]) -> dict[int, int]:
        """The first offset still stored per partition (exact, unlike the high watermark)."""
        return {p: max(0, watermarks(self._consumer, self.settings, self.topic, p)[0]) for p in partitions}

    def lag(self) -> dict[int, int]:
        """Records behind per partition from the last watermarks seen (0 at EOF); any thread."""
        return {
            p: 0 if p in self.at_eof else max(0, self._high.get(p, pos) - pos)
            for p, pos in list(self.positions.items())
        }

    def close(self) -> None:
        """Leave the group (the listener sees the revocation first)."""
        self._consumer.close()
