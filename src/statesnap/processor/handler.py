"""The processor's record handler: runs user code per record, with its stores and outputs.

It is the :class:`~statesnap.task.handler.RecordHandler` of a processor's task, so a processor
is consumed, committed, checkpointed, restored and rebalanced by exactly the engine a table is
(:class:`~statesnap.task.engine.Task`).
Per record: deserialize, set the cursor (offset, timestamp, stream time), call every handler;
on success the record's writes and outputs count, on failure they are dropped and the record
goes to the dead-letter topic (or processing stops with :class:`HandlerError`). At the end of a
partition's batch the writes reach the store in one ``apply``, with the task's stream time.

Stream time — what closes and expires windows, what ``ctx.stream_time`` and stream-time
punctuators see — is the largest timestamp of the partition's records *with a key*. A record
without a key belongs to no aggregation and moves no clock: a windowed aggregation in Kafka Streams
never sees it, so its windows close as Kafka Streams' do (``tests/integration/apache/
test_kafka_streams_oracle.py``). *Difference on purpose*: Kafka Streams' stream-time punctuators
follow the task's partition time, which keyless records do advance.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from threading import get_ident
from typing import Any

from statesnap.errors import HandlerError
from statesnap.processor.buffer import HELD_KEYS, HeldReads, WriteBuffer
from statesnap.processor.context import ProcessorContext, Record, record_of
from statesnap.processor.keyspace import (
    input_offset_key,
    input_offset_of,
    input_offset_value,
    partition_prefix,
    stream_time_key,
    stream_time_of,
    stream_time_value,
)
from statesnap.processor.outputs import Outputs
from statesnap.processor.stores import (
    NO_CALL,
    Cursor,
    KeyValueStore,
    StoreSpec,
    TtlKeyValueStore,
    WindowStore,
    unstamped,
)
from statesnap.python.hooks import Change
from statesnap.serde import Serde
from statesnap.serde.basic import BytesSerde
from statesnap.stores import StateStore
from statesnap.stores.base import KafkaMessage

__all__ = ["Handler", "ProcessorHandler", "Punctuation", "Punctuator"]

log = logging.getLogger(__name__)

#: A handler: called with every input record and the context.
Handler = Callable[[Record, ProcessorContext], None]
#: A punctuator: called with the context when stream time crosses a multiple of its period.
Punctuator = Callable[[ProcessorContext], None]

#: Seconds a commit point waits for emitted records to be delivered.
OUTPUT_FLUSH_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Punctuation:
    """*fn* runs when stream time crosses ``n * every_ms + offset_ms``."""

    every_ms: int
    fn: Punctuator
    offset_ms: int = 0

    def crossed(self, before: int, now: int) -> bool:
        """Whether stream time moving from *before* to *now* crossed one of the boundaries."""
        return (now - self.offset_ms) // self.every_ms > (before - self.offset_ms) // self.every_ms


class ProcessorHandler:
    """One processor task's handling of records (all its partitions)."""

    def __init__(
        self,
        *,
        name: str,
        store: StateStore,
        topic: str,
        specs: Sequence[StoreSpec],
        serdes: Mapping[str, tuple[Serde, Serde]],
        handlers: Sequence[Handler],
        punctuations: Sequence[Punctuation],
        key_serde: Serde,
        value_serde: Serde,
        outputs: Outputs,
        dead_letter_topic: str | None,
        inputs: Sequence[str] = (),
    ) -> None:
        """*topic* is the first input; *inputs* every input (default: *topic* alone)."""
        self.name = name
        self.store = store
        self.topic = topic
        self.inputs = tuple(inputs) or (topic,)
        self.multi = len(self.inputs) > 1
        #: Per partition, the first input's next offset at the last checkpoint: a row written for
        #: another input's record carries the first input's offset (a checkpoint's rows lie below
        #: its offsets, a delta's above its base's), so one written before the first input moved
        #: on needs a new base file.
        self._first_at_checkpoint: dict[int, int] = {}
        #: Partitions whose other inputs moved since the last checkpoint: a checkpoint that finds
        #: the first input's offset unchanged there re-references the old files and forgets the
        #: store's changes, so the next one must write them whole.
        self._others_moved: set[int] = set()
        self.handlers = tuple(handlers)
        self.punctuations = tuple(punctuations)
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.outputs = outputs
        self.dead_letter_topic = dead_letter_topic
        self.buffer = WriteBuffer(store)
        self.cursor = Cursor()
        views: dict[str, KeyValueStore] = {}
        window_views: dict[str, WindowStore] = {}
        self.windowed: list[WindowStore] = []
        #: TTL stores: (name, ttl ms); and per (store, partition) the stream time of the last sweep.
        self.expiring: list[tuple[str, int]] = []
        self._swept: dict[tuple[str, int], int] = {}
        for spec in specs:
            ks, vs = serdes[spec.name]
            ttl = spec.ttl_ms
            if ttl is not None:
                views[spec.name] = TtlKeyValueStore(spec.name, ks, vs, self.buffer, self.cursor, ttl)
                self.expiring.append((spec.name, ttl))
            elif spec.window is None:
                views[spec.name] = KeyValueStore(spec.name, ks, vs, self.buffer, self.cursor)
            else:
                window_views[spec.name] = WindowStore(
                    spec.name, ks, vs, self.buffer, self.cursor, spec.window
                )
                if window_views[spec.name].expires:
                    self.windowed.append(window_views[spec.name])
        if self.windowed:  # windows that come and go between checkpoints leave no tombstones
            store.track_births()
        self.context = ProcessorContext(self.cursor, views, window_views, outputs)
        #: A declared aggregation that is the processor's only step folds whole batches
        #: (statesnap.processor.folds): same state, skips and outputs, far fewer calls per record.
        self._batched: Any = None
        if len(self.handlers) == 1 and not self.punctuations and not self.multi:
            self._batched = getattr(self.handlers[0], "apply_batch", None)
        self.processed = 0
        self.dead_lettered = 0
        #: Records a declared step skipped (no key, a tombstone where none counts).
        self.skipped = 0
        #: The input positions (next offsets) applied so far: what exactly-once outputs commit
        #: as the group's offsets. The task sets it; its reader owns them.
        self.positions: Callable[[], Mapping[int, int]] = dict
        #: The other inputs' applied positions, per topic (the task sets it too).
        self.other_positions: Callable[[], Mapping[str, Mapping[int, int]]] = dict
        #: Per partition: (offset, timestamp) of the last record handled (expiry tombstones'
        #: origin), and partitions whose expired windows must leave the next checkpoint's files.
        self._last: dict[int, tuple[int, int]] = {}
        self._expired: set[int] = set()

    # --- records ---------------------------------------------------------------------------

    def stream_time(self, partition: int) -> int:
        """The partition's stream time as the store holds it (-1 before any timestamp), or as
        the buffer does while it holds the partition's writes."""
        key = stream_time_key(partition)
        held = self.buffer.held(key)
        return stream_time_of(self.store.get(key) if held is None else held[0])

    def hold_writes(self) -> bool:
        """Hold the writes of handlers and batch folds across batches, up to
        :data:`~statesnap.processor.buffer.HELD_KEYS` keys (see :mod:`statesnap.processor.buffer`):
        what a task asks for, on either engine. A window store's expiry goes through the buffer
        (:meth:`WriteBuffer.expire <statesnap.processor.buffer.WriteBuffer.expire>`), and its
        range scans find the held writes in range by its index of live windows. Not where a
        store has a TTL (its sweep scans the store itself) or a window store never expires (a
        join's buffers: without that index, a range scan would walk every held write). Returns
        whether they are held."""
        if self.expiring or any(not w.expires for w in self.context.window_stores.values()):
            return False
        self.buffer.hold = HELD_KEYS
        return True

    def reads(self) -> HeldReads:
        """The store as readers outside the handlers see it (held writes included)."""
        return HeldReads(self.buffer)

    def apply(self, partition: int, messages: Sequence[KafkaMessage], changes: list[Change] | None) -> None:
        del changes  # processors have no on_update hook: handlers see every record
        cursor, buffer, outputs = self.cursor, self.buffer, self.outputs
        if outputs.failure is not None:  # outputs that never committed: the state must not move on
            raise outputs.failure
        if outputs.due():  # the positions and the producer hold exactly the batches before this one
            self.commit_outputs()
        # Exactly-once restore: below this offset the outputs are committed, re-process for state only.
        until = outputs.replay_until.get(partition, -1)
        cursor.partition = partition
        buffer.switch(partition)
        started = stream_time = self.stream_time(partition)
        offset = ts = -1
        others: dict[str, int] = {}
        if not messages:
            pass
        elif self._batched is not None and until < 0:  # folded per batch (statesnap.processor.folds)
            stream_time, offset, ts = self._batched(self, partition, messages, stream_time)
            cursor.offset, cursor.timestamp, cursor.stream_time = offset, ts, stream_time
        else:
            buffer.settle()  # counts a batch fold held decoded: the views read the held writes
            # The call's thread, for the whole batch: the only one its stores answer (see
            # stores.py); no code but the handlers' and punctuators' runs on it meanwhile.
            cursor.thread = get_ident()
            try:
                stream_time, offset, ts = self._handle(partition, messages, stream_time, until, others)
            finally:
                cursor.thread = NO_CALL
        self.processed += len(messages)
        if stream_time != started:
            buffer.put(stream_time_key(partition), stream_time_value(stream_time), offset, ts)
            buffer.accept()
        if others:
            self._others_moved.add(partition)
            for other, next_offset in others.items():
                buffer.put(input_offset_key(partition, other), input_offset_value(next_offset), offset, ts)
            buffer.accept()
        buffer.apply(partition, len(messages))
        if offset >= 0:
            self._last[partition] = (offset, ts)
            if self.windowed and stream_time != started:
                self._expire_windows_of(partition, stream_time, offset, ts)

    def _handle(
        self,
        partition: int,
        messages: Sequence[KafkaMessage],
        stream_time: int,
        until: int,
        others: dict[str, int],
    ) -> tuple[int, int, int]:
        """The handlers over one batch, a record at a time: the per-record hot path, so it looks
        up nothing per record it can look up per batch, calls the one handler most processors
        have directly and skips the key decode where the key serde is the identity. With several
        inputs each record's row offset and replay bound are its input's, and the other inputs'
        next offsets go into *others*; below a replay bound (exactly-once restore) records are
        re-processed for their state only. Returns (stream time, last offset, last timestamp)."""
        cursor, buffer, outputs, context = self.cursor, self.buffer, self.outputs, self.context
        topic, handlers = self.topic, self.handlers
        only = handlers[0] if len(handlers) == 1 else None
        kdes = None if type(self.key_serde) is BytesSerde else self.key_serde.deserialize
        vdes = self.value_serde.deserialize
        thread = cursor.thread
        offset = ts = -1
        multi = self.multi
        if multi:
            # Rows carry offsets of the first input (the manifest's): another input's record
            # writes at the first input's last applied offset.
            first_next = int(self.positions().get(partition, 0))
            base = self._first_at_checkpoint.setdefault(partition, first_next)
            last_first = first_next - 1
            untils = {t: u.get(partition, -1) for t, u in outputs.replay_until_of.items()}
            first_topic = self.topic
            replaying = until >= 0 or any(u >= 0 for u in untils.values())
        undo, emitted = buffer.undo, outputs.pending
        punctuations = bool(self.punctuations)
        for message in messages:
            ts_type, ts = message.timestamp()
            if not ts_type:
                ts = -1
            before = stream_time
            raw_key = message.key()
            if ts > stream_time and raw_key is not None:
                stream_time = ts  # a record without a key moves no clock (see the module docstring)
            offset = record_offset = message.offset()
            if multi:
                topic = message.topic()  # type: ignore[attr-defined]
                if topic == first_topic:
                    last_first = offset
                    record_until = until
                else:
                    others[topic] = offset + 1
                    record_until = untils.get(topic, -1)
                    offset = last_first  # the row's offset: the first input's
                    if last_first < base:
                        self._expired.add(partition)
                if replaying:  # each input's records below its own committed offset
                    outputs.state_only = record_offset < record_until
                    outputs.state_only_records += outputs.state_only
            elif until >= 0:
                outputs.state_only = offset < until
                outputs.state_only_records += outputs.state_only
            cursor.offset, cursor.timestamp, cursor.stream_time = offset, ts, stream_time
            try:
                record = record_of(
                    raw_key if kdes is None or raw_key is None else kdes(raw_key),
                    message.value(),
                    vdes,
                    topic,
                    partition,
                    record_offset,
                    ts,
                    message,
                )
                if only is not None:
                    only(record, context)
                else:
                    for handler in handlers:
                        handler(record, context)
            except Exception as e:
                buffer.reject()
                outputs.reject()
                cursor.skipped = False
                self.fail_record(message, partition, e)
                continue
            if undo:
                undo.clear()
            if emitted:
                outputs.accept()
            if cursor.skipped:
                self.skipped += 1
                cursor.skipped = False
            if punctuations and stream_time > before >= 0:
                self._punctuate(before, stream_time)
                cursor.thread = thread
        if until >= 0 or (multi and replaying):
            outputs.state_only = False
        return stream_time, offset, ts

    def _punctuate(self, before: int, now: int) -> None:
        """Run each punctuator whose period boundary stream time just crossed (once per crossing)."""
        for punctuation in self.punctuations:
            if punctuation.crossed(before, now):
                self.cursor.enter()
                try:
                    punctuation.fn(self.context)
                except Exception as e:
                    self.buffer.reject()
                    self.outputs.reject()
                    raise HandlerError(
                        f"processor {self.name!r}: punctuator {_name_of(punctuation.fn)} failed at stream "
                        f"time {now} in partition {self.cursor.partition}: {type(e).__name__}: {e}",
                        topic=self.topic,
                        partition=self.cursor.partition,
                        offset=self.cursor.offset,
                    ) from e
                finally:
                    self.cursor.leave()
                self.buffer.accept()
                self.outputs.accept()

    def fail_record(self, message: KafkaMessage, partition: int, error: Exception) -> None:
        """A record the processor's code failed on, per record or in a batch fold
        (:mod:`statesnap.processor.folds`): set aside on the dead-letter topic with the error in
        its headers, or, without one, a :class:`HandlerError` that stops the processor."""
        topic = message.topic() if self.multi else self.topic  # type: ignore[attr-defined]
        where = f"{topic}[{partition}]@{message.offset()}"
        reason = f"{type(error).__name__}: {error}"
        if self.dead_letter_topic is None:
            raise HandlerError(
                f"processor {self.name!r}: handler failed on {where}: {reason[:300]} (pass "
                "ProcessingOptions(dead_letter_topic=...) to set such records aside and go on)",
                topic=topic,
                partition=partition,
                offset=message.offset(),
            ) from error
        headers = [(k, v) for k, v in (message.headers() or ()) if v is not None]  # type: ignore[attr-defined]
        headers += [
            ("statesnap.error", reason[:1000].encode()),
            ("statesnap.topic", topic.encode()),
            ("statesnap.partition", str(partition).encode()),
            ("statesnap.offset", str(message.offset()).encode()),
        ]
        ts_type, ts = message.timestamp()
        self.outputs.send_raw(
            self.dead_letter_topic, message.key(), message.value(), headers, ts if ts_type else -1
        )
        self.dead_lettered += 1
        log.warning(  # delivered, or the processor stops, by the next commit point
            "processor %s: %s goes to dead-letter topic %s: %s",
            self.name,
            where,
            self.dead_letter_topic,
            reason[:200],
        )

    # --- commit points ----------------------------------------------------------------------

    def commit_point(self, *, checkpoint: bool) -> None:
        self.buffer.commit()  # what the buffer holds goes into the store, and so the checkpoint
        self._expire_windows()
        self._expire_entries(every=checkpoint)
        if self.multi:
            self._store_input_ends()
        self.commit_outputs()

    def _store_input_ends(self) -> None:
        """Other inputs' positions that moved without a record (a partition's end past
        transaction markers, or an empty partition's log start) reach the keyspace too, so a
        restore knows where each input really continues and can tell records retention deleted
        from records that never were."""
        positions = self.positions()
        for topic, moved in self.other_positions().items():
            for p, position in moved.items():
                key = input_offset_key(p, topic)
                if int(position) <= input_offset_of(self.store.get(key)):
                    continue
                row_offset = int(positions.get(p, 0)) - 1  # rows carry the first input's offsets
                if row_offset < self._first_at_checkpoint.setdefault(p, row_offset + 1):
                    self._expired.add(p)
                self._others_moved.add(p)
                ts = self._last.get(p, (-1, -1))[1]
                self.store.apply(p, [(key, input_offset_value(int(position)), row_offset, ts)])

    def commit_outputs(self) -> None:
        """Deliver what was emitted (exactly-once: commit it with the input positions) — before
        any checkpoint may claim those positions."""
        if self.multi:
            self.outputs.commit(self.positions(), OUTPUT_FLUSH_TIMEOUT, self.other_positions())
        else:
            self.outputs.commit(self.positions(), OUTPUT_FLUSH_TIMEOUT)

    def _expire_windows(self) -> None:
        """Delete windows past retention in every partition (each batch that moves stream time
        does it for its partition: this catches partitions restored and not processed since)."""
        for partition, (offset, ts) in self._last.items():
            self._expire_windows_of(partition, self.stream_time(partition), offset, ts)

    def _expire_windows_of(self, partition: int, stream_time: int, offset: int, ts: int) -> None:
        """Delete *partition*'s windows past retention at *stream_time*, found by each window
        store's index of what it holds (see :class:`WindowStore`): the store never holds more
        than the live windows and those of one batch, and expiry costs what expires."""
        for windows in self.windowed:
            dead = windows.expired_keys(partition, stream_time)
            self.buffer.expire(windows.name, partition, stream_time - windows.windows.retention_ms, dead)
            if dead and self.store.expire(partition, dead, offset, ts):
                self._expired.add(partition)

    def _expire_entries(self, *, every: bool) -> None:
        """Delete TTL stores' expired entries: a pass over a partition's entries, so at most once
        per quarter TTL of stream time (reads hide expired entries meanwhile) — and, *every*, now
        (a checkpoint may follow: it must not hold what has expired)."""
        for partition, (offset, ts) in self._last.items():
            stream_time = self.stream_time(partition)
            for store, ttl in self.expiring:
                swept = self._swept.get((store, partition))
                if not every and swept is not None and stream_time - swept < ttl // 4:
                    continue
                self._swept[(store, partition)] = stream_time
                gone = [
                    (stored, None, offset, ts)
                    for stored, raw in self.store.scan(prefix=partition_prefix(store, partition))
                    if unstamped(raw, ttl, stream_time) is None
                ]
                if gone:
                    self.store.apply(partition, gone)
                    self._expired.add(partition)

    def release(self, partitions: Sequence[int]) -> None:
        """A consumer group took *partitions* away: forget what was known of them (gained again,
        they start from their restored state)."""
        self.buffer.flush()  # the store has everything before the partitions' rows go
        gone = set(partitions)
        for p in gone:
            self._first_at_checkpoint.pop(p, None)
            self._last.pop(p, None)
        self._others_moved -= gone
        self._expired -= gone
        for windows in self.windowed:
            windows.forget(gone)
        self._swept = {key: t for key, t in self._swept.items() if key[1] not in gone}

    def rebase_partitions(self) -> frozenset[int]:
        return frozenset(self._expired)

    def checkpointed(self) -> None:
        self._expired.clear()
        if self.multi:
            positions = self.positions()
            skipped = {
                p
                for p in self._others_moved
                if int(positions.get(p, 0)) == self._first_at_checkpoint.get(p, int(positions.get(p, 0)))
            }
            self._expired |= skipped
            self._others_moved.clear()
            self._first_at_checkpoint.update({p: int(o) for p, o in positions.items()})


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))
