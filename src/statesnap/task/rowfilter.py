"""Keeping a subset of a table: a key filter and a value projection, applied while restoring and
while tailing, so a replica holds only what it needs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from statesnap.stores.base import NO_TIMESTAMP, KafkaMessage, Record

__all__ = ["RowFilter"]


@dataclass(frozen=True, slots=True)
class RowFilter:
    """``key_filter(key) -> bool`` keeps a key; ``value_projection(value) -> bytes | None`` rewrites a value
    (``None`` drops the key, as a tombstone would)."""

    key_filter: Callable[[bytes], bool] | None = None
    value_projection: Callable[[bytes], bytes | None] | None = None

    def records(self, messages: Sequence[KafkaMessage]) -> list[Record]:
        """Changelog messages as records, filtered and projected. A key the filter rejects still
        gets a tombstone, so a row kept earlier can never linger."""
        out: list[Record] = []
        keep, project = self.key_filter, self.value_projection
        for m in messages:
            key = m.key()
            if key is None:
                continue
            value = m.value()
            if value is not None and keep is not None and not keep(key):
                value = None
            elif value is not None and project is not None:
                value = project(value)
            ts_type, ts = m.timestamp()
            out.append((key, value, m.offset(), ts if ts_type else NO_TIMESTAMP))
        return out

    def rows(self, table: pa.Table) -> pa.Table:
        """Checkpoint rows (no tombstones), filtered and projected."""
        if table.num_rows == 0:
            return table
        if self.key_filter is not None:
            keep = self.key_filter
            mask = pa.array([keep(k) for k in table.column("key").to_pylist()], pa.bool_())
            table = table.filter(mask)
        if self.value_projection is not None and table.num_rows:
            project = self.value_projection
            values = pa.array([project(v) for v in table.column("value").to_pylist()], pa.binary())
            table = table.set_column(table.schema.get_field_index("value"), "value", values)
            table = table.filter(pa.compute.is_valid(table.column("value")))
        return table
