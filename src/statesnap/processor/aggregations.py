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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.stores import StoreSpec
from statesnap.processor.windows import Windows
from statesnap.serde import Serde

__all__ = ["Aggregations"]

F = TypeVar("F", bound=Callable[..., Any])
#: What an aggregation reads from a record: a function, or the name of a field of a dict value.
ValueOf = Callable[[Record], Any] | str


def _value_of(value: ValueOf | None) -> Callable[[Record], Any]:
    if value is None:
        return lambda record: record.value
    if isinstance(value, str):
        field = value
        return lambda record: record.value[field]
    return value


class Aggregations:
    """The aggregation steps of :class:`~statesnap.Processor` (mixed in)."""

    def add_store(self, spec: str | StoreSpec) -> StoreSpec:
        raise NotImplementedError

    def handler(self, fn: F) -> F:
        raise NotImplementedError

    def count(
        self, store: str, *, window: Windows | None = None, value_serde: Serde | str | None = None
    ) -> StoreSpec:
        """Records per key (per key and window with *window*) into *store*."""
        return self.aggregate(
            store, lambda: 0, lambda count, _record: count + 1, window=window, value_serde=value_serde
        )

    def sum(
        self,
        store: str,
        value: ValueOf,
        *,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
    ) -> StoreSpec:
        """The sum per key of *value* (a function of the record, or a field of a dict value)."""
        of = _value_of(value)
        return self._fold(
            store, lambda: 0, lambda total, record: total + of(record), window, value_serde, tombstones=False
        )

    def reduce(
        self,
        store: str,
        fn: Callable[[Any, Any], Any],
        *,
        value: ValueOf | None = None,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
    ) -> StoreSpec:
        """``fn(aggregate, value)`` per key; a key's first value is its first aggregate."""
        of = _value_of(value)
        missing = object()

        def step(current: Any, record: Record) -> Any:
            return of(record) if current is missing else fn(current, of(record))

        return self._fold(store, lambda: missing, step, window, value_serde, tombstones=False)

    def aggregate(
        self,
        store: str,
        initializer: Callable[[], Any],
        fn: Callable[[Any, Record], Any],
        *,
        window: Windows | None = None,
        value_serde: Serde | str | None = None,
    ) -> StoreSpec:
        """``fn(aggregate, record)`` per key, starting from ``initializer()``: the general fold.
        Without a window a record with a null value is skipped; in a window *fn* gets it (as
        Kafka Streams' aggregator does)."""
        return self._fold(store, initializer, fn, window, value_serde, tombstones=window is not None)

    def _fold(
        self,
        store: str,
        initializer: Callable[[], Any],
        fn: Callable[[Any, Record], Any],
        window: Windows | None,
        value_serde: Serde | str | None,
        *,
        tombstones: bool,
    ) -> StoreSpec:
        """Register the fold; *tombstones*: whether records with a null value reach *fn*."""
        spec = self.add_store(StoreSpec(store, value_serde=value_serde or "json", window=window))
        if window is None:

            def fold(record: Record, ctx: ProcessorContext) -> None:
                if record.key is None or (record.is_tombstone and not tombstones):
                    return
                values = ctx.stores[store]
                current = values.get(record.key, _ABSENT)
                values[record.key] = fn(initializer() if current is _ABSENT else current, record)

        else:

            def fold(record: Record, ctx: ProcessorContext) -> None:
                if record.key is None or record.timestamp < 0 or (record.is_tombstone and not tombstones):
                    return
                windows = ctx.window_stores[store]
                for start in windows.windows_for(record.timestamp):
                    current = windows.get(record.key, start, _ABSENT)
                    windows.put(
                        record.key, start, fn(initializer() if current is _ABSENT else current, record)
                    )

        fold.__qualname__ = f"{type(self).__name__}.aggregate[{store}]"
        self.handler(fold)
        return spec


_ABSENT: Any = object()
