"""A processor's co-partitioned inputs read as one: partition p of every input belongs to task p.

:class:`MergedReader` reads every input with its own :class:`~statesnap.kafka.reader.ChangelogReader`
(each keeps its EOF, stall, out-of-range and retention checks), buffers what they fetch per
(input, partition) and hands the task, per partition, the records of every input in the order
:func:`~statesnap.processor.merge.pick` gives. To the task's loop it is the reader of the first
input: ``positions`` are that input's applied next offsets (the manifest's); the other inputs'
are written by the handler into the task's keyspace
(:func:`~statesnap.processor.keyspace.input_offset_key`), so a checkpoint holds them with the
state, and a restore reads them back from the restored store (:func:`restored_offsets`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from statesnap.checkpoint.manifest import NextOffset
from statesnap.errors import ConfigError, RecordsDeletedError
from statesnap.kafka.admin import KafkaAdmin, log_start_offsets
from statesnap.kafka.config import KafkaSettings
from statesnap.kafka.reader import BATCH_SIZE, ChangelogReader
from statesnap.processor.keyspace import input_offset_key, input_offset_of
from statesnap.processor.merge import pick
from statesnap.stores import StateStore

__all__ = ["MAX_BUFFERED", "MergedReader", "check_co_partitioned", "restored_offsets"]

log = logging.getLogger(__name__)

#: Records buffered per input beyond which it is not polled (unless a partition waits for its
#: head): a long run of one input's older records must not pull the other's history into memory.
MAX_BUFFERED = 2 * BATCH_SIZE


def check_co_partitioned(name: str, settings: KafkaSettings, topics: Sequence[str]) -> tuple[int, ...]:
    """The partitions every input has; a :class:`ConfigError` naming the topics and their counts
    when they differ (partition p of every input must belong to one task)."""
    admin = KafkaAdmin(settings)
    found = {topic: admin.partitions(topic) for topic in topics}
    if len(set(found.values())) > 1:
        counts = ", ".join(f"{topic!r} has {len(ps)}" for topic, ps in found.items())
        raise ConfigError(
            f"processor {name!r}: inputs are not co-partitioned ({counts} partitions); every input "
            "needs the same partition count"
        )
    return found[topics[0]]


def restored_offsets(store: StateStore, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """The next offset of input *topic* per partition, as the (restored) store holds it."""
    return {p: input_offset_of(store.get(input_offset_key(p, topic))) for p in partitions}


def _next_offset(message: Any) -> int:
    """The position after *message*, with its leader epoch where it has one (checkpoints keep
    it: a restore's reader has the leader check its log still holds that epoch there)."""
    epoch = message.leader_epoch() if hasattr(message, "leader_epoch") else None
    return NextOffset(message.offset() + 1, epoch) if epoch is not None else int(message.offset()) + 1


def _timestamp(message: Any) -> int:
    ts_type, ts = message.timestamp()
    return int(ts) if ts_type else -1


class MergedReader:
    """Reads *primary* and *others* (one reader per input, over the same partitions) and returns
    per partition the merged records of every input.

    ``max_idle``: how long a partition with records waiting waits for an input with nothing
    buffered — at its end or not: a live input at its end is about to deliver — before it goes on
    without that input, and goes on while that input stays empty (Kafka Streams'
    ``max.task.idle.ms``; 0 waits only for an input that has not reached its end). It holds while
    catching up too: a start at the live edge (every deploy of a running pipeline) would
    otherwise merge the end of its catch-up in order of arrival. Catching up, the wait gives up
    only on inputs at their end; one that has not reached its end has records to fetch and is
    always waited for (a lost cluster is reported by the inputs' own stall checks). A replay whose
    inputs end at different times pays ``max_idle`` once per partition."""

    def __init__(
        self,
        primary: ChangelogReader,
        others: Sequence[ChangelogReader],
        *,
        max_idle: float,
    ) -> None:
        self.readers = (primary, *others)
        self.topics = tuple(r.topic for r in self.readers)
        self.topic = primary.topic
        self.settings = primary.settings
        self.max_idle = max_idle
        #: Applied next offsets per input (index) and partition; ``positions`` is the first's.
        self.applied_at: list[dict[int, int]] = [dict(r.positions) for r in self.readers]
        self.positions: dict[int, int] = self.applied_at[0]
        self._buffers: dict[tuple[int, int], deque[Any]] = {
            (i, p): deque() for i in range(len(self.readers)) for p in self.positions
        }
        self._returned: dict[int, dict[int, int]] = {}
        self._blocked_since: dict[int, float] = {}
        self._said_idle: set[int] = set()
        self._tailing = False
        self._deleted: RecordsDeletedError | None = None

    def _check_log_starts(self, log_starts: Mapping[str, Mapping[int, int]]) -> None:
        """An input (not the first: the checkpoint's selection judges that one) whose restored
        offset lies below its log start: retention deleted records the checkpoint never saw. The
        next poll raises :class:`RecordsDeletedError` naming the input, partition and offsets, so
        the task replays from the beginning or, with ``require``, fails — never skips input."""
        holes = self._holes(self.applied_at[0], self.applied_at[1:], log_starts)
        if holes and self._deleted is None:
            self._deleted = next(iter(holes.values()))

    def _holes(
        self,
        first: Mapping[int, int],
        others: Sequence[Mapping[int, int]],
        log_starts: Mapping[str, Mapping[int, int]],
    ) -> dict[int, RecordsDeletedError]:
        """Per partition whose offset of another input (*others*, in input order) lies below its
        log start, the error naming the first such input; *first*: the first input's offsets (a
        partition it starts at 0 continues no checkpoint, whatever the others' log starts)."""
        holes: dict[int, RecordsDeletedError] = {}
        for reader, offsets in zip(self.readers[1:], others, strict=True):
            for p, low in sorted(log_starts.get(reader.topic, {}).items()):
                pos = offsets.get(p, 0)
                if p not in holes and (0 < pos < low or (pos == 0 < low and first.get(p, 0) > 0)):
                    holes[p] = RecordsDeletedError(reader.topic, p, pos, low, self.settings.bootstrap_servers)
        return holes

    def holes(self, offsets: Mapping[int, int], store: StateStore) -> dict[int, RecordsDeletedError]:
        """For partitions a group is about to give the task, at *offsets* of the first input
        restored into *store*: those that another input cannot continue, as :meth:`gain` would
        find them (the task then replays them from the beginning instead: see
        :meth:`~statesnap.processor.task.ProcessorTaskHandler.restored`)."""
        partitions = tuple(sorted(offsets))
        others = [restored_offsets(store, r.topic, partitions) for r in self.readers[1:]]
        return self._holes(offsets, others, self._log_starts(partitions, offsets, others))

    @classmethod
    def continuing(
        cls,
        primary: ChangelogReader,
        others: Sequence[str],
        store: StateStore,
        *,
        max_idle: float,
    ) -> MergedReader:
        """The merged reader continuing *primary* with *others* at the offsets *store* holds
        (a group member's *primary* holds no partition yet: they come with :meth:`gain`)."""
        partitions = tuple(sorted(primary.positions))
        readers: list[ChangelogReader] = []
        try:
            for topic in others:
                readers.append(
                    ChangelogReader(primary.settings, topic, restored_offsets(store, topic, partitions))
                )
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        merged = cls(primary, readers, max_idle=max_idle)
        merged._check_log_starts(merged._log_starts(partitions))
        return merged

    def _log_starts(
        self,
        partitions: Sequence[int],
        first: Mapping[int, int] | None = None,
        others: Sequence[Mapping[int, int]] | None = None,
    ) -> dict[str, dict[int, int]]:
        """The other inputs' log starts over *partitions*, where a restore continues from offsets
        retention may have passed (a fresh start from 0 everywhere needs none). *first*,
        *others*: the offsets it continues from (default: those applied)."""
        first = self.applied_at[0] if first is None else first
        others = self.applied_at[1:] if others is None else others
        starts: dict[str, dict[int, int]] = {}
        for reader, offsets in zip(self.readers[1:], others, strict=True):
            if any(offsets.get(p, 0) or first.get(p, 0) for p in partitions):
                starts[reader.topic] = log_start_offsets(self.settings, reader.topic, tuple(partitions))
        return starts

    # --- a consumer group moves the first input's partitions; the others follow --------------

    def gain(self, offsets: Mapping[int, int], store: StateStore) -> None:
        """The group gave the first input's reader the partitions of *offsets* (next offset of
        the first input, restored into *store*): read them from every input, each of the others
        at the offset *store* holds for it."""
        partitions = tuple(sorted(offsets))
        self.applied_at[0].update(offsets)
        for i, reader in enumerate(self.readers):
            for p in partitions:
                self._buffers[(i, p)] = deque()
            if i:
                restored = restored_offsets(store, reader.topic, partitions)
                self.applied_at[i].update(restored)
                reader.reassign(restored)
        self._check_log_starts(self._log_starts(partitions))

    def drop(self, partitions: Sequence[int]) -> None:
        """The group took *partitions* away (or the task closes): forget what was read of them
        from every input."""
        for p in partitions:
            for i in range(len(self.readers)):
                self._buffers.pop((i, p), None)
                self.applied_at[i].pop(p, None)
            self._returned.pop(p, None)
            self._blocked_since.pop(p, None)
            self._said_idle.discard(p)
        for reader in self.readers[1:]:
            reader.reassign({}, partitions)

    # --- the reader surface the task's loop uses --------------------------------------------

    @property
    def tailing(self) -> bool:
        return self._tailing

    @tailing.setter
    def tailing(self, value: bool) -> None:
        self._tailing = value
        for reader in self.readers:
            reader.tailing = value

    def _ended(self, i: int, p: int) -> bool:
        return not self._buffers[(i, p)] and p in self.readers[i].at_eof

    @property
    def at_eof(self) -> set[int]:
        """Partitions at the end of every input, nothing buffered."""
        return {p for p in self.positions if all(self._ended(i, p) for i in range(len(self.readers)))}

    @property
    def caught_up(self) -> bool:
        return all(r.caught_up for r in self.readers) and not any(self._buffers.values())

    def lag(self) -> dict[int, int]:
        """Records behind per partition, summed over the inputs (buffered ones included)."""
        lags = [r.lag() for r in self.readers]
        return {
            p: sum(lag.get(p, 0) for lag in lags)
            + sum(len(self._buffers[(i, p)]) for i in range(len(self.readers)))
            for p in self.positions
        }

    def _wants(self, i: int) -> bool:
        """Poll input *i*: it has little buffered, or some partition waits for its head."""
        reader = self.readers[i]
        buffered = 0
        for p in self.positions:
            n = len(self._buffers[(i, p)])
            if not n and p not in reader.at_eof:
                return True
            buffered += n
        return buffered < MAX_BUFFERED

    def poll(self, timeout: float = 0.5) -> dict[int, list[Any]]:
        """Fetch from every input, then per partition the merged records that may go now (at most
        a batch). :meth:`applied` must follow for each partition returned."""
        if self._deleted is not None:
            raise self._deleted
        share = timeout / len(self.readers)
        for i, reader in enumerate(self.readers):
            if not self._wants(i):
                continue
            for p, messages in reader.poll(share).items():
                buffer = self._buffers.get((i, p))
                if buffer is None:  # no longer the task's (dropped in a rebalance)
                    continue
                # The reader's positions are what it fetched (where it would re-assign).
                reader.applied(p, messages[-1].offset() + 1)
                buffer.extend(messages)
        for i, reader in enumerate(self.readers):
            for p, fetched in reader.positions.items():
                # At its end with nothing buffered: every record below is applied (markers moved it).
                if not self._buffers.get((i, p)) and fetched > self.applied_at[i].get(p, fetched):
                    self.applied_at[i][p] = fetched
        out: dict[int, list[Any]] = {}
        consumed = self.readers[0].positions  # a group member's suspended partitions wait
        for p in list(self.positions):
            if p not in consumed:
                continue
            merged = self._merge(p)
            if merged:
                out[p] = merged
        return out

    def _merge(self, p: int) -> list[Any]:
        buffers = [self._buffers[(i, p)] for i in range(len(self.readers))]
        ended = [p in r.at_eof for r in self.readers]
        # An input at its end holds the merge too (up to max_idle): its next record may be older
        # than the other inputs' heads (a live join's other side, a batch behind).
        waits = [False] * len(buffers) if self.max_idle > 0 else ended
        out: list[Any] = []
        ends: dict[int, int] = {}
        heads: list[int | None] = [_timestamp(b[0]) if b else None for b in buffers]
        if all(h is not None for h in heads):
            # Every input delivered: any idle wait is over. Until then the clock runs on: past
            # max_idle the task keeps processing while an input stays empty (a new wait starts
            # once it has delivered), as Kafka Streams does past max.task.idle.ms.
            self._blocked_since.pop(p, None)
            self._said_idle.discard(p)
        while len(out) < BATCH_SIZE:
            i = pick(heads, waits)
            if i is None:
                i = self._after_idle(p, heads, ended)
                if i is None:
                    break
            message = buffers[i].popleft()
            out.append(message)
            ends[i] = _next_offset(message)
            heads[i] = _timestamp(buffers[i][0]) if buffers[i] else None
        if out:
            self._returned[p] = ends
        return out

    def _after_idle(self, p: int, heads: list[int | None], ended: list[bool]) -> int | None:
        """A task does not wait past ``max_idle`` for an input that says nothing — following, for
        any input; catching up, for an input at its end only."""
        if all(h is None for h in heads):
            return None
        now = time.monotonic()
        since = self._blocked_since.setdefault(p, now)
        if now - since < self.max_idle:
            return None
        gives_up = [True] * len(heads) if self._tailing else ended
        i = pick(heads, gives_up)
        if i is not None and p not in self._said_idle:  # once per wait, not per batch
            self._said_idle.add(p)
            waiting = [self.topics[i] for i, h in enumerate(heads) if h is None]
            log.log(
                logging.INFO if self._tailing else logging.DEBUG,
                "partition %d: no record of %s for %.1fs; going on without them",
                p,
                waiting,
                now - since,
            )
        return i

    def applied(self, partition: int, next_offset: int) -> None:
        """The task applied the batch :meth:`poll` returned for *partition* (every input's part
        of it; *next_offset* is the last record's and is not needed)."""
        del next_offset
        for i, end in self._returned.pop(partition, {}).items():
            self.applied_at[i][partition] = end

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
