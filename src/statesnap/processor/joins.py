"""Joins of co-partitioned inputs — windowed stream–stream and stream–table — as processor steps,
with Kafka Streams' semantics (``KStream.join/leftJoin/outerJoin(KStream, JoinWindows)`` and
``KStream.join/leftJoin(KTable)``), proven against Kafka Streams itself by
``tests/integration/apache/test_kafka_streams_join_oracle.py``::

    proc = Processor("ads", inputs=["ad-clicks", "ad-impressions"], value_serde="json", ...)
    proc.join("clicks-with-impressions", left="ad-clicks", right="ad-impressions",
              window=JoinWindows.of("10m", grace="1m"), how="left", to="clicks-joined")
    proc.join_table("orders-enriched", stream="orders", table="customers", how="left", to="orders-out")

Durations read as everywhere (``"10s"``, ``"5m"``, a number of seconds). A join's handler sees
only its own two inputs' records (a processor may read more). A joined value is
``joiner(left_value, right_value)``; the default joiner makes ``{"left": L,
"right": R}`` (None for a missing side). A result keeps the input's key (the output stays
co-partitioned) and goes out through ``ctx.emit`` with the processor's guarantee: at least once,
or exactly once with ``ProcessingOptions(exactly_once=True)``; every buffer is a store,
checkpointed with the rest.

**Stream–stream** (``join``): a left record at ``t`` joins every right record of its key whose
timestamp lies in ``[t - before, t + after]`` (a right record at ``t`` the left ones in ``[t -
after, t + before]``), whichever arrives first; a pair's timestamp is the larger of the two. The
join's stream time is the largest timestamp of either input, *null-key and null-value records
included* (Kafka Streams' shared time tracker; unlike the aggregations' clock). Rules, as in
Kafka Streams 4.1:

- A record with a null value is skipped, and so is one with a null key — except on an outer side
  (the left of ``how="left"``, both of ``"outer"``), where a null-key record is sent at once
  joined with None (KIP-962).
- ``left``/``outer``: a record no partner joined is sent joined with None *once its window has
  closed* (stream time past ``t + after + grace`` for a left record, ``t + before + grace`` for a
  right one), never eagerly (the spurious-result fix of 3.1). Closed records go out when a record
  with a key and a value reaches the join's stream time, before that record's own results, with
  the closed record's timestamp. A record already behind stream time by more than its window
  (``t + after < stream time``) that finds no partner is sent joined with None at once.
- Each side buffers its records for ``before + after + grace`` behind its own newest timestamp
  (Kafka Streams' window-store retention): older ones are not buffered and not found.
- A record later than that still joins what the other side buffers (Kafka Streams does not drop
  late join records; only retention bounds them).

Buffers: ``<name>-left``/``<name>-right`` (window stores of buckets of about a quarter of ``before
+ after``; values ``[[timestamp, value], ...]``, JSON unless ``buffer_serde`` says otherwise),
``<name>-unmatched`` (left/outer: records waiting for their window to close) and ``<name>-clock``
(the join's stream time and each side's newest timestamp). A bucket leaves its store once every
record in it is past retention behind its side's newest record, so a side holds at most
``before + after + grace`` plus one bucket of records, however long the streams run.

**Stream–table** (``join_table``): the table is an input topic (materialized in the store
``<name>``: a record sets its key's value, a tombstone deletes it, a null key is skipped, and no
table update produces output) or a key-value store of the processor (``store=``, kept by other
steps). A stream record looks up its key's value *at processing time* (the inputs are merged by
timestamp); ``inner`` sends only found ones, ``left`` every record (None when absent). A stream
record with a null value is skipped; one with a null key is skipped, except by ``left``, which
sends it joined with None (KIP-962). Results carry the stream record's timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import StrEnum
from typing import Any, Self, TypeVar

from statesnap.durations import parse_duration
from statesnap.errors import ConfigError
from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.stores import StoreKind, StoreSpec, WindowStore
from statesnap.processor.windows import Windows
from statesnap.serde import Serde, resolve_serde

__all__ = ["How", "JoinWindows", "Joins", "default_joiner"]

F = TypeVar("F", bound=Callable[..., Any])
Joiner = Callable[[Any, Any], Any]
#: Retention of the unmatched-record store: entries leave it when emitted or joined, never by age.
FOREVER_MS = 2**62
#: The key of a join's clock in its ``-clock`` store (one row per partition).
CLOCK = "clock"


class How(StrEnum):
    """Which records a join sends: pairs only, or also unmatched ones (joined with None)."""

    INNER = "inner"
    LEFT = "left"
    OUTER = "outer"


def default_joiner(left: Any, right: Any) -> dict[str, Any]:
    """The joined value when no joiner is given: ``{"left": L, "right": R}``."""
    return {"left": left, "right": right}


def _ms(value: str | float | timedelta, what: str) -> int:
    ms = round(parse_duration(value) / timedelta(milliseconds=1))
    if ms < 0:
        raise ConfigError(f"join window {what} must not be negative, got {value!r}")
    return ms


@dataclass(frozen=True, slots=True)
class JoinWindows:
    """Kafka Streams' ``JoinWindows`` (milliseconds): a left record at ``t`` joins right records
    in ``[t - before, t + after]``; records may arrive *grace* behind stream time."""

    before_ms: int
    after_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if self.before_ms < 0 or self.after_ms < 0 or self.grace_ms < 0:
            raise ConfigError(
                f"join window before, after and grace must not be negative, got {self.before_ms}, "
                f"{self.after_ms}, {self.grace_ms} ms"
            )

    @classmethod
    def of(cls, within: str | float | timedelta, *, grace: str | float | timedelta = 0) -> JoinWindows:
        """Records at most *within* apart, either way (``JoinWindows.ofTimeDifferenceAndGrace``)."""
        ms = _ms(within, "difference")
        return cls(ms, ms, _ms(grace, "grace"))

    def before(self, within: str | float | timedelta) -> JoinWindows:
        """The same, with right records up to *within* before a left one (``JoinWindows.before``)."""
        return replace(self, before_ms=_ms(within, "before"))

    def after(self, within: str | float | timedelta) -> JoinWindows:
        """The same, with right records up to *within* after a left one (``JoinWindows.after``)."""
        return replace(self, after_ms=_ms(within, "after"))

    @property
    def retention_ms(self) -> int:
        """How long behind its side's newest record a record stays joinable (Kafka Streams')."""
        return self.before_ms + self.after_ms + self.grace_ms

    def buckets(self) -> Windows:
        """The windows of a side's buffer: buckets of a quarter of the join span. The join
        deletes them itself at the side's retention (Kafka Streams' rule: behind the side's own
        newest record, not the task's stream time), so the store's own retention never does."""
        size = max(1, -(-(self.before_ms + self.after_ms + 1) // 4))
        return Windows(size, size, 0, FOREVER_MS)


def _how(name: str, how: How | str, allowed: tuple[How, ...]) -> How:
    try:
        checked = How(how)
    except ValueError:
        checked = None
    if checked not in allowed:
        shown = ", ".join(repr(h.value) for h in allowed)
        raise ConfigError(f"join {name!r}: how must be one of {shown}, got {how!r}")
    assert checked is not None
    return checked


class Joins:
    """The join steps of :class:`~statesnap.Processor` (mixed in)."""

    inputs: tuple[str, ...]

    def add_store(self, spec: str | StoreSpec) -> StoreSpec:
        raise NotImplementedError

    def handler(self, fn: F) -> F:
        raise NotImplementedError

    @property
    def stores(self) -> Mapping[str, StoreSpec]:
        raise NotImplementedError

    def _join_inputs(self, name: str, **topics: str) -> None:
        for role, topic in topics.items():
            if topic not in self.inputs:
                raise ConfigError(
                    f"join {name!r}: {role} {topic!r} is not an input of the processor "
                    f"(inputs: {', '.join(self.inputs)}); add it to inputs="
                )
        if len(set(topics.values())) < len(topics):
            raise ConfigError(f"join {name!r}: the two sides must be different input topics")

    def join(
        self,
        name: str,
        *,
        left: str,
        right: str,
        window: JoinWindows,
        to: str,
        how: How | str = How.INNER,
        joiner: Joiner = default_joiner,
        value_serde: Serde | str | None = None,
        buffer_serde: Serde | str = "json",
    ) -> None:
        """A windowed stream–stream join of the inputs *left* and *right* (Kafka Streams'
        ``join/leftJoin/outerJoin`` with ``JoinWindows``); results to *to*, encoded with
        *value_serde* (default: the processor's). See the module docstring."""
        checked = _how(name, how, (How.INNER, How.LEFT, How.OUTER))
        self._join_inputs(name, left=left, right=right)
        buckets = window.buckets()
        stores = StreamJoinStores.of(name, outer=checked is not How.INNER)
        for side in (stores.left, stores.right):
            self.add_store(StoreSpec(side, value_serde=buffer_serde, window=buckets))
        self.add_store(StoreSpec(stores.clock, key_serde="json", value_serde="json"))
        if stores.unmatched is not None:
            forever = Windows(1, 1, 0, FOREVER_MS)
            self.add_store(StoreSpec(stores.unmatched, value_serde=buffer_serde, window=forever))
        step = StreamJoin(stores, left, right, window, checked, joiner, to, value_serde)
        self.handler(step.named(f"{type(self).__name__}.join[{name}]"))

    def join_table(
        self,
        name: str,
        *,
        stream: str,
        to: str,
        table: str | None = None,
        store: str | None = None,
        how: How | str = How.INNER,
        joiner: Joiner = default_joiner,
        value_serde: Serde | str | None = None,
    ) -> None:
        """A stream–table join (Kafka Streams' ``KStream.join/leftJoin(KTable)``): each record of
        the input *stream* joined with its key's value in the *table* input topic (kept in the
        store *name*) or in the processor's key-value *store*; results to *to*."""
        checked = _how(name, how, (How.INNER, How.LEFT))
        if (table is None) == (store is None):
            raise ConfigError(f"join {name!r}: give the table as table=<input topic> or store=<store name>")
        if table is not None:
            self._join_inputs(name, stream=stream, table=table)
            self.add_store(StoreSpec(name))
        else:
            self._join_inputs(name, stream=stream)
            spec = self.stores.get(store or "")
            if spec is None or spec.kind is not StoreKind.KEY_VALUE:
                raise ConfigError(
                    f"join {name!r}: store={store!r} is not a key-value store of the processor; "
                    "declare it (add_store or an aggregation) before the join"
                )
        step = TableJoin(stream, table, store or name, checked, joiner, to, value_serde)
        self.handler(step.named(f"{type(self).__name__}.join_table[{name}]"))


@dataclass(frozen=True, slots=True)
class StreamJoinStores:
    """The store names of one stream–stream join."""

    left: str
    right: str
    clock: str
    unmatched: str | None

    @classmethod
    def of(cls, name: str, *, outer: bool) -> StreamJoinStores:
        """The stores of join *name*; *outer*: it keeps unmatched records (left and outer joins)."""
        return cls(f"{name}-left", f"{name}-right", f"{name}-clock", f"{name}-unmatched" if outer else None)


class StreamJoin:
    """The handler of a stream–stream join: Kafka Streams' ``KStreamKStreamJoin`` (left and
    right processors, their window stores, the shared time tracker and the outer-join store),
    as one step over both inputs."""

    def __init__(
        self,
        stores: StreamJoinStores,
        left: str,
        right: str,
        window: JoinWindows,
        how: How,
        joiner: Joiner,
        to: str,
        value_serde: Serde | str | None,
    ) -> None:
        self.stores = stores
        self.left, self.right = left, right
        self.before, self.after, self.grace = window.before_ms, window.after_ms, window.grace_ms
        self.retention = window.retention_ms
        self.bucket = window.buckets().size_ms
        self.left_outer = how is not How.INNER
        self.right_outer = how is How.OUTER
        self.joiner = joiner
        self.to = to
        self.value_serde = None if value_serde is None else resolve_serde(value_serde)

    def named(self, qualname: str) -> Self:
        """The step, with the name errors and logs give it (a handler's ``__qualname__``)."""
        self.__qualname__ = qualname
        return self

    def __call__(self, record: Record, ctx: ProcessorContext) -> None:
        topic = record.topic
        if topic == self.left:
            is_left = True
        elif topic == self.right:
            is_left = False
        else:
            return
        ts = record.timestamp
        if ts < 0:  # no timestamp: in no window (Kafka Streams' extractors fail on it or skip it)
            return
        clocks = ctx.stores[self.stores.clock]
        # [stream time, min time, then per side (left, right): newest timestamp, buckets swept]
        clock = clocks.get(CLOCK) or [-1, None, -1, -1, None, None]
        stream_time = clock[0] = max(clock[0], ts)
        key = record.key
        try:
            if key is None:
                if not record.is_tombstone and (self.left_outer if is_left else self.right_outer):
                    self._send(ctx, None, record.value, None, is_left, ts)
                return
            side = 2 if is_left else 3  # this side's newest timestamp; +2: its swept buckets
            if not record.is_tombstone:
                if self.stores.unmatched is not None and ts == stream_time:
                    clock[1] = self._emit_closed(ctx, stream_time, clock[1], is_left)
                clock[1] = self._join(ctx, record, is_left, stream_time, clock[1], clock[5 - side])
            # The record's own side buffers it after the join (Kafka Streams' KStreamJoinWindow).
            seen = clock[side] = max(clock[side], ts)
            buffer = ctx.window_stores[self.stores.left if is_left else self.stores.right]
            if not record.is_tombstone and ts > seen - self.retention:
                start = ts // self.bucket * self.bucket
                buffer.put(key, start, [*buffer.get(key, start, []), [ts, record.value]])
            clock[side + 2] = self._sweep(buffer, seen, clock[side + 2])
        finally:
            clocks[CLOCK] = clock

    def _sweep(self, buffer: WindowStore, seen: int, swept: int | None) -> int:
        """Delete the side's buckets wholly past retention behind its newest record *seen*
        (Kafka Streams' retention, per side); returns the newest bucket start deleted. One range
        scan per bucket that leaves, across keys (a window store's keys begin with the start)."""
        bucket = self.bucket
        dead_through = (seen - self.retention + 1) // bucket * bucket - bucket
        if swept is None:  # the side's first record: nothing buffered yet
            return dead_through
        if dead_through > swept:
            for key, start, _entries in buffer.fetch_all(swept + 1, dead_through):
                buffer.delete(key, start)
            return dead_through
        return swept

    def _send(self, ctx: ProcessorContext, key: Any, this: Any, other: Any, is_left: bool, ts: int) -> None:
        value = self.joiner(this, other) if is_left else self.joiner(other, this)
        ctx.emit(self.to, key, value, timestamp=ts, value_serde=self.value_serde)

    def _join(
        self,
        ctx: ProcessorContext,
        record: Record,
        is_left: bool,
        stream_time: int,
        min_time: int | None,
        other_seen: int,
    ) -> int | None:
        """Join *record* with the other side's buffer; returns the tracker's new min time."""
        ts, key, value = record.timestamp, record.key, record.value
        before, after = (self.before, self.after) if is_left else (self.after, self.before)
        time_from, time_to = max(0, ts - before), max(0, ts + after)
        low = max(time_from, other_seen - self.retention + 1)  # the other side's retention
        found: list[tuple[int, Any]] = []
        if low <= time_to:
            other = ctx.window_stores[self.stores.right if is_left else self.stores.left]
            first = low // self.bucket * self.bucket
            for _start, entries in other.fetch(key, first, time_to):
                found.extend((t, v) for t, v in entries if low <= t <= time_to)
            found.sort(key=lambda entry: entry[0])  # stable: arrival order within a timestamp
        unmatched = self.stores.unmatched
        for other_ts, other_value in found:
            if unmatched is not None:
                _drop(ctx.window_stores[unmatched], key, other_ts, "r" if is_left else "l")
            self._send(ctx, key, value, other_value, is_left, max(ts, other_ts))
        if not found and (self.left_outer if is_left else self.right_outer):
            assert unmatched is not None
            if time_to < stream_time:  # already closed: no partner can come any more
                self._send(ctx, key, value, None, is_left, ts)
            else:
                min_time = ts if min_time is None else min(min_time, ts)
                waiting = ctx.window_stores[unmatched]
                sides = waiting.get(key, ts) or {}
                side = "l" if is_left else "r"
                sides[side] = [*sides.get(side, []), value]
                waiting.put(key, ts, sides)
        return min_time

    def _emit_closed(
        self, ctx: ProcessorContext, stream_time: int, min_time: int | None, is_left: bool
    ) -> int | None:
        """Send the unmatched records whose window closed (Kafka Streams'
        ``emitNonJoinedOuterRecords``, its scan order and its min-time shortcut included, so the
        same records go out at the same input record); returns the new min time."""
        this_after = self.after if is_left else self.before
        if min_time is not None and min_time + this_after + self.grace >= stream_time:
            return min_time
        assert self.stores.unmatched is not None
        waiting = ctx.window_stores[self.stores.unmatched]
        key_bytes = waiting.key_serde.serialize
        entries = [
            (ts, side == "l", key_bytes(key), key, side, values)
            for key, ts, sides in waiting.fetch_all(0, stream_time)
            for side, values in sides.items()
        ]
        entries.sort(key=lambda e: (e[0], e[1], e[2]))  # Kafka Streams: time, right before left, key
        min_time = None
        left_open = right_open = False
        for ts, left_entry, _raw, key, side, values in entries:
            min_time = ts
            if left_open and right_open:
                break
            lookback = self.after if left_entry else self.before
            if ts + lookback + self.grace >= stream_time:
                if left_entry:
                    left_open = True
                else:
                    right_open = True
                continue
            for value in values:
                self._send(ctx, key, value, None, left_entry, ts)
            _drop(waiting, key, ts, side)
        return min_time


def _drop(waiting: WindowStore, key: Any, ts: int, side: str) -> None:
    """Forget the unmatched records of one side at (key, ts): they were joined or sent."""
    sides = waiting.get(key, ts)
    if sides is None or side not in sides:
        return
    del sides[side]
    if sides:
        waiting.put(key, ts, sides)
    else:
        waiting.delete(key, ts)


class TableJoin:
    """The handler of a stream–table join (Kafka Streams' ``KStreamKTableJoin`` and the
    ``KTableSource`` that keeps the table)."""

    def __init__(
        self,
        stream: str,
        table: str | None,
        store: str,
        how: How,
        joiner: Joiner,
        to: str,
        value_serde: Serde | str | None,
    ) -> None:
        self.stream, self.table, self.store = stream, table, store
        self.left = how is How.LEFT
        self.joiner = joiner
        self.to = to
        self.value_serde = None if value_serde is None else resolve_serde(value_serde)

    def named(self, qualname: str) -> Self:
        """The step, with the name errors and logs give it (a handler's ``__qualname__``)."""
        self.__qualname__ = qualname
        return self

    def __call__(self, record: Record, ctx: ProcessorContext) -> None:
        topic, key = record.topic, record.key
        if topic == self.table:
            if key is None:
                return
            rows = ctx.stores[self.store]
            if record.is_tombstone:
                rows.pop(key, None)
            else:
                rows[key] = record.value
            return
        if topic != self.stream or record.is_tombstone:
            return
        if key is None:
            if self.left:
                self._send(ctx, None, record.value, None)
            return
        found = ctx.stores[self.store].get(key)
        if found is not None or self.left:
            self._send(ctx, key, record.value, found)

    def _send(self, ctx: ProcessorContext, key: Any, value: Any, found: Any) -> None:
        ctx.emit(self.to, key, self.joiner(value, found), value_serde=self.value_serde)
