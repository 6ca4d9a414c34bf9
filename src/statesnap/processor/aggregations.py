"""Aggregations per key — count, sum, reduce, aggregate — optionally over event-time windows:
Kafka Streams' ``groupByKey().count()/reduce()/aggregate()`` as processor steps.

Each call declares a store (values as JSON unless another serde is given) and registers a handler
that folds records into it. A window store's rows are ``(key, window start) → aggregate`` and
leave the store, and the next checkpoint, at retention.

Which records count — Kafka Streams' rules, proven against Kafka Streams itself by
``tests/integration/apache/test_kafka_streams_oracle.py``:

- A record without a key is skipped (it belongs to no group), and it moves no stream time, so it
  closes no window (see :mod:`statesnap.processor.handler`).
- Without a window, a record with a null value (a tombstone) is skipped by every aggregation
  (``KStreamAggregate``/``KStreamReduce`` drop it).
- In a window, ``count`` counts a tombstone and ``aggregate`` hands it to its function, as Kafka
  Streams' windowed aggregator does; ``sum`` and ``reduce`` skip it. *Difference on purpose*: Kafka
  Streams would hand the null value to the adder or reducer (a ``NullPointerException`` in most
  code); statesnap leaves the aggregate as it was.
- In a window, so are records without a timestamp and late records (their windows closed: stream
  time passed end + grace); no window starts below 0 (the epoch).

An aggregation that is its processor's only step is folded a polled batch at a time
(:mod:`statesnap.processor.folds`: each key read and written once per batch), with exactly the
per-record rules above.

Results reach a topic with ``to=`` (:class:`Emit`): ``emit="changes"`` sends every update, as
Kafka Streams' ``KTable.toStream().to(topic)`` with the record cache off; ``emit="final"`` sends
one result per window once stream time passes its end plus grace, as
``suppress(untilWindowCloses(...))`` (Quix: ``.final()``). An emitted record keeps the input's
key (the output stays co-partitioned); its value is the aggregate, or for a window ``{"start": S,
"end": E, "value": V}`` (milliseconds), encoded with the store's value serde (JSON unless
``value_serde`` says otherwise). A change carries the input record's timestamp, a final result its
window's last millisecond (``end - 1``). Delivery is the processor's: at least once, or exactly
once with ``ProcessingOptions(exactly_once=True)``; which windows were emitted is checkpointed
with the store, so a restore re-emits none a checkpoint covers, and a final result is never lost.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from enum import StrEnum
from typing import Any, TypeVar

from statesnap.errors import ConfigError
from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.folds import COUNT, Fold
from statesnap.processor.stores import StoreSpec
from statesnap.processor.windows import Windows
from statesnap.serde import Serde

__all__ = ["Aggregations", "Emit"]

F = TypeVar("F", bound=Callable[..., Any])
#: What an aggregation reads from a record: a function, or the name of a field of a dict value.
ValueOf = Callable[[Record], Any] | str


class Emit(StrEnum):
    """What an aggregation sends to its ``to=`` topic."""

    #: Every update of the aggregate (Kafka Streams ``toStream()``).
    CHANGES = "changes"
    #: One result per window when it closes (Kafka Streams ``suppress(untilWindowCloses)``).
    FINAL = "final"


def _value_of(value: ValueOf | None) -> Callable[[Record], Any]:
    if value is None:
        return lambda record: record.value
    if isinstance(value, str):
        field = value
        return lambda record: record.value[field]
    return value


def _emission(store: str, window: Windows | None, emit: Emit | str | None, to: str | None) -> Emit | None:
    """The checked emission of one aggregation (None: the store only)."""
    if emit is None:
        if to is None:
            return None
        return Emit.CHANGES
    try:
        how = Emit(emit)
    except ValueError:
        raise ConfigError(f"aggregation {store!r}: emit must be 'changes' or 'final', got {emit!r}") from None
    if to is None:
        raise ConfigError(f"aggregation {store!r}: emit={how.value!r} needs to=<topic>")
    if how is Emit.FINAL and window is None:
        raise ConfigError(
            f"aggregation {store!r}: emit='final' needs a window (a result without one never closes); "
            "use emit='changes'"
        )
    return how


def _zero() -> int:
    return 0


class Aggregations:
    """The aggregation steps of :class:`~statesnap.Processor` (mixed in)."""

    def add_store(self, spec: str | StoreSpec) -> StoreSpec:
        raise NotImplementedError

    def handler(self, fn: F) -> F:
        raise NotImplementedError

    def punctuate(
        self, every: str | float | timedelta, *, offset: str | float | timedelta = 0
    ) -> Callable[[F], F]:
        raise NotImplementedError

    def count(
        self,
        store: str,
        *,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
        emit: Emit | str | None = None,
        to: str | None = None,
    ) -> StoreSpec:
        """Records per key (per key and window with *window*) into *store*; with *to*, results
        go to that topic as *emit* says (see the module docstring)."""
        return self.aggregate(
            store,
            _zero,
            COUNT,
            window=window,
            value_serde=value_serde,
            emit=emit,
            to=to,
        )

    def sum(
        self,
        store: str,
        value: ValueOf,
        *,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
        emit: Emit | str | None = None,
        to: str | None = None,
    ) -> StoreSpec:
        """The sum per key of *value* (a function of the record, or a field of a dict value)."""
        of = _value_of(value)
        return self._fold(
            store,
            _zero,
            lambda total, record: total + of(record),
            window,
            value_serde,
            _emission(store, window, emit, to),
            to,
            tombstones=False,
            field=value if isinstance(value, str) else None,
        )

    def reduce(
        self,
        store: str,
        fn: Callable[[Any, Any], Any],
        *,
        value: ValueOf | None = None,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
        emit: Emit | str | None = None,
        to: str | None = None,
    ) -> StoreSpec:
        """``fn(aggregate, value)`` per key; a key's first value is its first aggregate."""
        of = _value_of(value)
        missing = object()

        def step(current: Any, record: Record) -> Any:
            return of(record) if current is missing else fn(current, of(record))

        return self._fold(
            store,
            lambda: missing,
            step,
            window,
            value_serde,
            _emission(store, window, emit, to),
            to,
            tombstones=False,
        )

    def aggregate(
        self,
        store: str,
        initializer: Callable[[], Any],
        fn: Callable[[Any, Record], Any],
        *,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
        emit: Emit | str | None = None,
        to: str | None = None,
    ) -> StoreSpec:
        """``fn(aggregate, record)`` per key, starting from ``initializer()``: the general fold.
        Without a window a record with a null value is skipped; in a window *fn* gets it (as
        Kafka Streams' aggregator does)."""
        how = _emission(store, window, emit, to)
        return self._fold(store, initializer, fn, window, value_serde, how, to, tombstones=window is not None)

    def _fold(
        self,
        store: str,
        initializer: Callable[[], Any],
        fn: Callable[[Any, Record], Any],
        window: Windows | None,
        value_serde: Serde | str | None,
        emit: Emit | None,
        to: str | None,
        *,
        tombstones: bool,
        field: str | None = None,
    ) -> StoreSpec:
        """Register the fold (and its emission); *tombstones*: whether records with a null value
        reach *fn*; *field*: *fn* adds that field of the value (a sum's)."""
        spec = self.add_store(StoreSpec(store, value_serde=value_serde or "json", window=window))
        changes = to if emit is Emit.CHANGES else None
        fold = Fold(store, initializer, fn, window, changes, tombstones=tombstones, field=field)
        if window is not None and emit is Emit.FINAL:
            assert to is not None
            # Windows close when stream time reaches n·advance + size + grace: a punctuator
            # with that period and phase runs exactly then, not at every advance of stream
            # time (138 k calls for 2 k closes in the final_results benchmark).
            advance, closes_after = window.advance_ms, window.size_ms + window.grace_ms
            self.punctuate(
                timedelta(milliseconds=advance), offset=timedelta(milliseconds=closes_after % advance)
            )(_final_results(store, window, to))
        fold.__qualname__ = f"{type(self).__name__}.aggregate[{store}]"
        self.handler(fold)
        return spec


def _final_results(store: str, window: Windows, to: str) -> Callable[[ProcessorContext], None]:
    """The punctuator that emits the windows of *store* closed by stream time, once each: the
    windows starting after the last emitted one, up to the newest closed one (a range scan of
    the window store), then marks them emitted in the store itself."""
    size, advance, closes_after = window.size_ms, window.advance_ms, window.size_ms + window.grace_ms

    def emit_closed(ctx: ProcessorContext) -> None:
        newest_closed = (ctx.stream_time - closes_after) // advance * advance  # a window's start
        windows = ctx.window_stores[store]
        done = windows.emitted_through()
        if newest_closed <= done:
            return
        serde = windows.value_serde
        for key, start, value in windows.fetch_all(done + 1, newest_closed, expired=True):
            envelope = {"start": start, "end": start + size, "value": value}
            ctx.emit(to, key, envelope, timestamp=start + size - 1, value_serde=serde)
        windows.mark_emitted(newest_closed)

    emit_closed.__qualname__ = f"final_results[{store}]"
    return emit_closed
