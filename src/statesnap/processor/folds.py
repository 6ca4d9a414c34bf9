"""The fold of a declared aggregation (:mod:`statesnap.processor.aggregations`), per record and
per polled batch.

Per record (:meth:`Fold.__call__`) it is a handler like any other: read the key's aggregate from
its store, fold the record in, write it back (a store read, a value decode, a value encode and a
buffered write per record). When the aggregation is the processor's only step (no other handler,
no punctuator, one input, no exactly-once replay), the task hands it whole batches instead
(:meth:`Fold.apply_batch`): each distinct key of the batch is read and decoded once, folded in a
dict as its records come, and written once at the end with the offset and timestamp of its last
record — what the per-record path leaves in the store, for a fraction of its calls (a count
builds no record object at all). Everything a record sees is the same, in the same order: stream
time moves per record (so lateness and grace are judged per record), the null-key and null-value
rules, every change emitted as it happens, a fold that raises sends its record to the
dead-letter topic (or stops) with nothing of it written.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import accumulate, groupby
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import orjson

from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.held_counts import FreshWindow
from statesnap.processor.keyspace import partition_prefix, window_bytes
from statesnap.processor.windows import Windows
from statesnap.serde import Serde
from statesnap.serde.basic import BytesSerde, JsonSerde

if TYPE_CHECKING:
    from statesnap.processor.handler import ProcessorHandler
    from statesnap.processor.held_counts import CountGroup, HeldCounts
    from statesnap.processor.outputs import Outputs
    from statesnap.stores.base import KafkaMessage

__all__ = ["COUNT", "Fold"]

_ABSENT: Any = object()


def _count(count: Any, _record: Record) -> Any:
    return count + 1


#: What ``count`` folds with: the batch path adds 1 without building a record for it.
COUNT: Callable[[Any, Record], Any] = _count


def _identity(serde: Serde) -> bool:
    """Whether *serde* stores a key as its Kafka bytes (decoding and encoding change nothing)."""
    return type(serde) is BytesSerde


#: 19 digits in a row: JsonSerde decodes such a document with the standard library (orjson
#: would read a number that long as a float).
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _decode_many(serde: Serde, held: list[bytes | None], initializer: Callable[[], Any]) -> list[Any]:
    """Each stored value decoded (the initial aggregate where none): JSON in one orjson call
    over the values joined as an array, where that gives exactly what each decode would."""
    present: list[bytes] = held if None not in held else [raw for raw in held if raw is not None]  # type: ignore[assignment]
    values: list[Any] | None = None
    if present and type(serde) is JsonSerde:
        joined = b"[" + b",".join(present) + b"]"
        if _LONG_DIGITS.search(joined) is None:
            try:
                values = orjson.loads(joined)
            except orjson.JSONDecodeError:
                values = None
            if values is not None and len(values) != len(present):
                values = None
    if values is None:
        values = [serde.deserialize(raw) for raw in present]
    if len(present) == len(held):
        return values
    it = iter(values)
    return [initializer() if raw is None else next(it) for raw in held]


def _encode_many(serde: Serde, values: list[Any]) -> list[bytes]:
    """Each value encoded: JSON integers as their digits in one pass (what JsonSerde writes)."""
    if type(serde) is JsonSerde and (not values or set(map(type, values)) == {int}):
        return [str(v).encode() for v in values]
    return [serde.serialize(v) for v in values]


def _runs(stamps: list[int], size: int) -> Iterator[tuple[int, int, int]]:
    """(window start, first, end) of each run of records in one tumbling window of *size*, in
    order: by bisection where the timestamps rise (the usual batch), else record by record."""
    if stamps == sorted(stamps):
        at, n = 0, len(stamps)
        while at < n:
            start = stamps[at] - stamps[at] % size
            end = bisect_left(stamps, start + size, at)
            yield start, at, end
            at = end
        return
    at = 0
    for start, run in groupby([t - t % size for t in stamps]):
        end = at + len(list(run))
        yield start, at, end
        at = end


class _Lookups(NamedTuple):
    """A batch fold's per-batch lookups (:meth:`Fold._prelude`), unpacked into locals."""

    view: Any
    prefix: bytes
    kdes: Callable[[bytes], Any]
    kser: Callable[[Any], bytes]
    vdes: Callable[[bytes], Any]
    load: Callable[[bytes], bytes | None]
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]
    serde: Serde
    outputs: Outputs
    topic: str


class Fold:
    """One aggregation's step: a handler (``fold(record, ctx)``) that also folds whole batches."""

    def __init__(
        self,
        store: str,
        initializer: Callable[[], Any],
        fn: Callable[[Any, Record], Any],
        window: Windows | None,
        changes: str | None,
        *,
        tombstones: bool,
        field: str | None = None,
    ) -> None:
        """*field*: *fn* adds this field of the record's (decoded, dict) value (``sum("c",
        "amount")``), which the batch path then reads without building a record."""
        self.store = store
        self.initializer = initializer
        self.fn = fn
        self.window = window
        #: The topic every change goes to (None: the store only).
        self.changes = changes
        self.tombstones = tombstones
        self.field = field
        self.__qualname__ = f"aggregate[{store}]"

    # --- per record ----------------------------------------------------------------------------

    def __call__(self, record: Record, ctx: ProcessorContext) -> None:
        store, fn, initializer, changes = self.store, self.fn, self.initializer, self.changes
        if self.window is None:
            if record.key is None or (record.is_tombstone and not self.tombstones):
                ctx.skip()
                return
            values = ctx.stores[store]
            current = values.get(record.key, _ABSENT)
            values[record.key] = result = fn(initializer() if current is _ABSENT else current, record)
            if changes is not None:
                ctx.emit(changes, record.key, result, value_serde=values.value_serde)
            return
        if record.key is None or record.timestamp < 0 or (record.is_tombstone and not self.tombstones):
            ctx.skip()
            return
        size = self.window.size_ms
        windows = ctx.window_stores[store]
        for start in windows.windows_for(record.timestamp):
            current = windows.get(record.key, start, _ABSENT)
            result = fn(initializer() if current is _ABSENT else current, record)
            windows.put(record.key, start, result)
            if changes is not None:
                envelope = {"start": start, "end": start + size, "value": result}
                ctx.emit(changes, record.key, envelope, value_serde=windows.value_serde)

    # --- per batch -----------------------------------------------------------------------------

    def apply_batch(
        self, h: ProcessorHandler, partition: int, messages: Sequence[KafkaMessage], stream_time: int
    ) -> tuple[int, int, int]:
        """Fold *messages* (one partition's batch, in offset order) as the per-record path would
        (see the module docstring); returns (stream time, last offset, last timestamp) for the
        handler's end of batch. The aggregates go into the write buffer, not yet the store."""
        if self.fn is COUNT and self.changes is None:
            counted = self._count_batch(h, partition, messages, stream_time)
            if counted is not None:
                return counted
        h.buffer.settle()  # the held counts are read from the held writes from here on
        if self.window is None:
            return self._batch_by_key(h, partition, messages, stream_time)
        return self._batch_by_window(h, partition, messages, stream_time)

    def _count_batch(
        self, h: ProcessorHandler, partition: int, messages: Sequence[KafkaMessage], stream_time: int
    ) -> tuple[int, int, int] | None:
        """A count without emission, columnar: the batch's keys, values and timestamps as lists
        (one C-level call per record each), the records per key (or per key and tumbling window)
        by ``Counter``, then per distinct key one batched store read, one batched decode and
        encode, one buffered write — the state the per-record path leaves. None (nothing done)
        where a rule needs the per-record path: a record without key, value (a non-windowed
        count skips it) or timestamp, a key serde that is not the identity, a hopping window."""
        window = self.window
        if window is not None and (window.advance_ms != window.size_ms or not self.tombstones):
            return None
        if window is None and self.tombstones:
            return None
        view: Any = h.context.stores[self.store] if window is None else h.context.window_stores[self.store]
        if not (_identity(h.key_serde) and _identity(view.key_serde)):
            return None
        keys = [m.key() for m in messages]
        if None in keys:
            return None
        if window is None and None in [m.value() for m in messages]:
            return None
        stamps = [ts if kind else -1 for kind, ts in [m.timestamp() for m in messages]]
        newest = max(stamps)
        if window is not None and min(stamps) < 0:
            return None
        prefix = partition_prefix(self.store, partition)
        listed = view.index_many if window is not None and view.expires else None
        held_counts = h.buffer.counts(self.store, partial(_encode_many, view.value_serde), listed)
        if held_counts is not None:
            serde, held_keys = view.value_serde, cast("list[bytes]", keys)
            if window is None:
                self._add_held(h, held_counts.of(partition), serde, held_keys, messages, stamps, 0)
            else:
                self._add_held_windows(
                    h, held_counts, partition, serde, held_keys, messages, stamps, stream_time
                )
            return max(stream_time, newest), messages[-1].offset(), stamps[-1]
        if window is None:
            groups: list[Any] = keys
            tally = Counter(groups)
            last = dict(zip(groups, range(len(groups)), strict=True))
            stored = [prefix + k for k in last]
        else:
            size, closes_after = window.size_ms, window.size_ms + window.grace_ms
            # stream time at each record (a running max), and each record's window start
            clock = accumulate(stamps, max, initial=stream_time)
            next(clock)
            starts = [t - t % size for t in stamps]
            open_ = [now < start + closes_after for now, start in zip(clock, starts, strict=True)]
            groups = [(k, s) for k, s, ok in zip(keys, starts, open_, strict=True) if ok]
            at = [i for i, ok in enumerate(open_) if ok]
            tally = Counter(groups)
            last = {g: at[j] for j, g in enumerate(groups)}
            stored = [prefix + window_bytes(s) + k for k, s in last]
        buffer = h.buffer
        held = buffer.get_many(stored)
        currents = _decode_many(view.value_serde, held, self.initializer)
        results = [c + n for c, n in zip(currents, map(tally.__getitem__, last), strict=True)]
        encoded = _encode_many(view.value_serde, results)
        if buffer.batch:  # something is buffered already: the rows join it, written in order
            rows = [(v, messages[i].offset(), stamps[i]) for v, i in zip(encoded, last.values(), strict=True)]
            buffer.batch.update(zip(stored, rows, strict=True))
        else:  # the batch's only writes (stream time aside, another key): straight to the store
            buffer.store.apply(
                partition,
                [
                    (k, v, messages[i].offset(), stamps[i])
                    for k, v, i in zip(stored, encoded, last.values(), strict=True)
                ],
            )
        if window is not None and view.expires:
            index = view.index
            for key, (_k, start) in zip(stored, last, strict=True):
                index(partition, start, key)
        return max(stream_time, newest), messages[-1].offset(), stamps[-1]

    def _add_held(
        self,
        h: ProcessorHandler,
        group: CountGroup,
        serde: Serde,
        keys: list[bytes],
        messages: Sequence[KafkaMessage],
        stamps: list[int],
        first: int,
    ) -> None:
        """Records added to a group of the counts held decoded (statesnap.processor.held_counts):
        *keys* are those of ``messages[first:]``' first ``len(keys)``. Only keys not held yet
        are read (held writes, then the store) and decoded, once per hand-over."""
        last = dict(zip(keys, range(first, first + len(keys)), strict=True))  # each key's last record
        at = list(last.values())
        offsets = [messages[i].offset() for i in at]
        load = partial(self._load, h, group.prefix, serde)
        group.add(keys, last, offsets, list(map(stamps.__getitem__, at)), load)

    def _load(self, h: ProcessorHandler, prefix: bytes, serde: Serde, keys: list[bytes]) -> list[Any]:
        """The current aggregates of *keys* (Kafka key bytes under *prefix*): held or stored."""
        return _decode_many(serde, h.buffer.get_many([prefix + k for k in keys]), self.initializer)

    def _add_held_windows(
        self,
        h: ProcessorHandler,
        held: HeldCounts,
        partition: int,
        serde: Serde,
        keys: list[bytes],
        messages: Sequence[KafkaMessage],
        stamps: list[int],
        stream_time: int,
    ) -> None:
        """A tumbling window count's batch into the counts held decoded, a run of records of one
        window at a time (timestamps mostly rise: a batch has few runs). A run's records are all
        open or all late: each is earlier than its window's end, so none of them moves stream
        time to the window's close — only what came before the run can have. A window the store
        has no keys of is counted without reads (:class:`~statesnap.processor.held_counts.FreshWindow`)."""
        window = self.window
        assert window is not None
        view = h.context.window_stores[self.store]
        closes_after = window.size_ms + window.grace_ms
        now = stream_time
        offsets: list[int] | None = None
        for start, at, end in _runs(stamps, window.size_ms):
            if now < start + closes_after:
                group = held.group(partition, start)
                if group is None and view.expires and not view.lists(partition, start):
                    group = held.fresh(partition, start)
                if isinstance(group, FreshWindow):
                    if offsets is None:
                        offsets = [m.offset() for m in messages]
                    group.add(keys[at:end], offsets[at:end], stamps[at:end])
                else:
                    group = held.of(partition, start)
                    self._add_held(h, group, serde, keys[at:end], messages, stamps, at)
            now = max(now, *stamps[at:end])

    def _prelude(self, h: ProcessorHandler, partition: int) -> _Lookups:
        """What both batch folds (by key, by window) look up once per batch: the aggregation's
        store view, the partition's key prefix, the serdes' and the buffer's bound methods, the
        store's value serde, the outputs and the input topic."""
        view: Any = (h.context.stores if self.window is None else h.context.window_stores)[self.store]
        return _Lookups(
            view,
            partition_prefix(self.store, partition),
            h.key_serde.deserialize,
            view.key_serde.serialize,
            h.value_serde.deserialize,
            h.buffer.get,
            view.value_serde.deserialize,
            view.value_serde.serialize,
            view.value_serde,
            h.outputs,
            h.topic,
        )

    def _batch_by_key(
        self, h: ProcessorHandler, partition: int, messages: Sequence[KafkaMessage], stream_time: int
    ) -> tuple[int, int, int]:
        (_view, prefix, kdes, kser, vdes, load, decode, encode, serde, outputs, topic) = self._prelude(
            h, partition
        )
        fn, initializer, tombstones, changes = self.fn, self.initializer, self.tombstones, self.changes
        counting, field = fn is COUNT, self.field
        #: raw key → (decoded key, stored key); stored key → [aggregate, offset, timestamp].
        keys: dict[bytes, tuple[Any, bytes]] = {}
        folded: dict[bytes, list[Any]] = {}
        preloaded = self._preload(h, prefix, messages)
        skipped = 0
        offset = ts = -1
        for message in messages:
            ts_type, ts = message.timestamp()
            if not ts_type:
                ts = -1
            offset = message.offset()
            raw_key = message.key()
            if raw_key is None:
                skipped += 1  # no key: no group, and no clock moved (see handler.py)
                continue
            if ts > stream_time:  # noqa: PLR1730 - a call to max() costs more per record
                stream_time = ts
            raw = message.value()
            try:
                known = keys.get(raw_key)
                if known is None:  # the key is decoded before any rule looks at the record
                    key = kdes(raw_key)
                    known = keys[raw_key] = (key, prefix + kser(key))
                key, stored = known
                if raw is None and not tombstones:
                    skipped += 1
                    continue
                entry = folded.get(stored)
                if entry is None:
                    if preloaded is None:
                        held = load(stored)
                        current = initializer() if held is None else decode(held)
                    else:
                        current = preloaded.get(stored, _ABSENT)
                        if current is _ABSENT:
                            current = initializer()
                    entry = [current, offset, ts]
                    fresh = True
                else:
                    current = entry[0]
                    fresh = False
                if counting:
                    result = current + 1
                elif field is not None:  # sum of a field: what the fold's own record would read
                    result = current + vdes(raw)[field]  # type: ignore[arg-type]
                else:
                    result = fn(current, Record(key, raw, vdes, topic, partition, offset, ts, message))
            except Exception as e:
                h.cursor.partition = partition
                h.fail_record(message, partition, e)
                continue
            if fresh:
                folded[stored] = entry
            entry[0], entry[1], entry[2] = result, offset, ts
            if changes is not None:
                outputs.emit(changes, key, result, None, ts, serde)
                outputs.accept()
        batch = h.buffer.batch
        for stored, (value, at, stamp) in folded.items():
            batch[stored] = (encode(value), at, stamp)
        h.skipped += skipped
        return stream_time, offset, ts

    def _preload(
        self, h: ProcessorHandler, prefix: bytes, messages: Sequence[KafkaMessage]
    ) -> dict[bytes, Any] | None:
        """The aggregates of the batch's keys (held or stored), read by one ``get_many`` and
        decoded at once (absent keys absent), where the keys are stored as their Kafka bytes;
        None otherwise, or if a value does not decode (then each is read in turn, its record
        failing as it would per record)."""
        view = h.context.stores[self.store]
        if not (_identity(h.key_serde) and _identity(view.key_serde)):
            return None
        stored = [prefix + k for k in dict.fromkeys(m.key() for m in messages) if k is not None]
        held = h.buffer.get_many(stored)
        present = [(k, raw) for k, raw in zip(stored, held, strict=True) if raw is not None]
        try:
            values = _decode_many(view.value_serde, [raw for _, raw in present], self.initializer)
        except Exception:
            return None
        return dict(zip([k for k, _ in present], values, strict=True))

    def _batch_by_window(
        self, h: ProcessorHandler, partition: int, messages: Sequence[KafkaMessage], stream_time: int
    ) -> tuple[int, int, int]:
        window = self.window
        assert window is not None
        (view, prefix, kdes, kser, vdes, load, decode, encode, serde, outputs, topic) = self._prelude(
            h, partition
        )
        fn, initializer, tombstones, changes = self.fn, self.initializer, self.tombstones, self.changes
        counting = fn is COUNT
        size, advance, closes_after = window.size_ms, window.advance_ms, window.size_ms + window.grace_ms
        keys: dict[bytes, tuple[Any, bytes]] = {}
        #: stored key → [aggregate, offset, timestamp, window start].
        folded: dict[bytes, list[Any]] = {}
        skipped = 0
        offset = ts = -1
        for message in messages:
            ts_type, ts = message.timestamp()
            if not ts_type:
                ts = -1
            offset = message.offset()
            raw_key = message.key()
            if raw_key is None:
                skipped += 1
                continue
            if ts > stream_time:  # noqa: PLR1730 - a call to max() costs more per record
                stream_time = ts
            raw = message.value()
            record: Record | None = None
            try:
                known = keys.get(raw_key)
                if known is None:  # the key is decoded before any rule looks at the record
                    key = kdes(raw_key)
                    known = keys[raw_key] = (key, kser(key))
                key, key_bytes = known
                if ts < 0 or (raw is None and not tombstones):
                    skipped += 1
                    continue
                # Windows.starts, less those closed at this record's stream time (windows_for)
                first = max((ts - size) // advance + 1, 0)
                results = []
                for start in range(first * advance, ts // advance * advance + 1, advance):
                    if stream_time >= start + closes_after:
                        continue  # closed: late for this window
                    stored = prefix + window_bytes(start) + key_bytes
                    entry = folded.get(stored)
                    if entry is None:
                        held = load(stored)
                        current = initializer() if held is None else decode(held)
                    else:
                        current = entry[0]
                    if counting:
                        result = current + 1
                    else:
                        if record is None:
                            record = Record(key, raw, vdes, topic, partition, offset, ts, message)
                        result = fn(current, record)
                    results.append((stored, start, result, entry))
            except Exception as e:
                h.cursor.partition = partition
                h.fail_record(message, partition, e)
                continue
            for stored, start, result, entry in results:
                if entry is None:
                    folded[stored] = [result, offset, ts, start]
                else:
                    entry[0], entry[1], entry[2] = result, offset, ts
                if changes is not None:
                    envelope = {"start": start, "end": start + size, "value": result}
                    outputs.emit(changes, key, envelope, None, ts, serde)
            if changes is not None and results:
                outputs.accept()
        batch = h.buffer.batch
        index = view.index if view.expires else None
        for stored, (value, at, stamp, start) in folded.items():
            batch[stored] = (encode(value), at, stamp)
            if index is not None:
                index(partition, start, stored)
        h.skipped += skipped
        return stream_time, offset, ts
