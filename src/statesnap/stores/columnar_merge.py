"""Folding the columnar store's overlay into its base: the per-partition data-file tables an
export writes (and a fold adopts as the next base). See :mod:`statesnap.stores.columnar`."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statesnap.checkpoint import datafile
from statesnap.keys.order import key_order
from statesnap.stores.base import HEADER_SIZE, header_fields
from statesnap.stores.columnar_base import Base, Segment

__all__ = ["merge", "no_negative_timestamps"]

#: An overlay smaller than this share of the base is matched to base rows by index probes (a
#: Python call per key); a larger one by one vectorized ``index_in`` over every base key.
_PROBE_SHARE = 16


def merge(base: Base, over: dict[bytes, bytes]) -> dict[int, pa.Table]:
    """Base rows not overridden, plus the overlay's live rows, per partition sorted by key.

    Most overlay rows update a base row: they replace its value, offset and timestamp in place
    (the base is sorted, so the partition stays sorted and nothing is sorted again); tombstones
    drop their row. Only a partition that gains new keys is sorted, unless they all come after
    its last key (ever-growing ids, timestamps). Overlay rows are matched to base rows by one
    ``index_in`` over every base chunk for a large overlay (its hash set built once), by index
    probes for a small one."""
    if not over:
        return {
            p: no_negative_timestamps(pa.concat_tables([s.table for s in base.partitions[p]]))
            for p in sorted(base.partitions)
        }
    keys = pa.array(list(over), pa.binary())
    blobs = pa.array(list(over.values()), pa.binary())
    raw_part, offsets, ts = header_fields(blobs)
    dead = raw_part < 0
    partitions = np.where(dead, ~raw_part, raw_part)
    values = pc.binary_slice(blobs, HEADER_SIZE, (1 << 31) - 1)
    del blobs
    placed = np.zeros(len(keys), bool)  # overlay rows that replaced a row of their own partition
    parts: dict[int, list[pa.Table]] = {}
    for seg, rows, src in _matches(base, over, keys):
        table = seg.table
        if src.size:
            same = (partitions[src] == seg.partition) & ~dead[src]
            placed[src[same]] = True
            table = _replaced(table, rows[same], src[same], values, offsets, ts)
            if not same.all():  # deleted, or written to another partition (added there below)
                keep = np.ones(table.num_rows, bool)
                keep[rows[~same]] = False
                table = table.filter(pa.array(keep))
        if table.num_rows:
            parts.setdefault(seg.partition, []).append(table)
    added = np.flatnonzero(~dead & ~placed)
    new_rows: dict[int, pa.Table] = {}
    if added.size:
        by_part = partitions[added]
        for p in np.unique(by_part).tolist():
            pick = added[by_part == p]
            rows = pa.array(pick)
            new_rows[p] = pa.table(
                {
                    "key": keys.take(rows),
                    "value": values.take(rows),
                    "offset": pa.array(offsets[pick]),
                    "timestamp": pa.array(ts[pick], mask=ts[pick] < 0).cast(datafile.TIMESTAMP),
                },
                schema=datafile.SCHEMA,
            )
    out: dict[int, pa.Table] = {}
    for p in sorted(set(parts) | set(new_rows)):
        tables = parts.get(p, [])
        fresh = new_rows.get(p)
        if fresh is None:
            merged = pa.concat_tables(tables)
        else:
            fresh = fresh.take(pa.array(key_order(fresh.column("key"))))
            last = tables[-1].column("key")[-1].as_py() if tables else None
            if last is None or fresh.column("key")[0].as_py() > last:
                merged = pa.concat_tables([*tables, fresh])  # new keys after the old: appended
            else:
                merged = datafile.sorted_rows(pa.concat_tables([*tables, fresh]))
        out[p] = no_negative_timestamps(merged.cast(datafile.SCHEMA))
    return out


def _matches(
    base: Base, over: dict[bytes, bytes], keys: pa.Array
) -> Iterator[tuple[Segment, np.ndarray, np.ndarray]]:
    """Per base segment: its rows that the overlay writes again, and the overlay positions
    (in the order of *over*) that write them, both ascending by row."""
    if not base.rows:
        return
    if len(over) * _PROBE_SHARE < base.rows:
        found: dict[int, list[tuple[int, int]]] = {}
        for j, key in enumerate(over):
            located = base.locate(key)
            if located is not None:
                found.setdefault(located[0].number, []).append((located[1], j))
        for seg in base.segments:
            hits = sorted(found.get(seg.number, ()))
            rows = np.fromiter((r for r, _ in hits), np.int64, count=len(hits))
            yield seg, rows, np.fromiter((j for _, j in hits), np.int64, count=len(hits))
        return
    chunks = [seg.table.column("key").chunk(0) for seg in base.segments]
    where = pc.index_in(pa.chunked_array(chunks, pa.binary()), value_set=keys).fill_null(-1).to_numpy()
    start = 0
    for seg, chunk in zip(base.segments, chunks, strict=True):
        here = where[start : start + len(chunk)]
        start += len(chunk)
        rows = np.flatnonzero(here >= 0)
        yield seg, rows, here[rows].astype(np.int64)


def _replaced(
    table: pa.Table, rows: np.ndarray, src: np.ndarray, values: pa.Array, offsets: np.ndarray, ts: np.ndarray
) -> pa.Table:
    """*table* with rows *rows* taking value, offset and timestamp of overlay rows *src*."""
    if not rows.size:
        return table
    mask = np.zeros(table.num_rows, bool)
    mask[rows] = True
    hit = pa.array(mask)
    stamps = ts[src]
    columns = {
        "key": table.column("key"),
        "value": pc.replace_with_mask(table.column("value").chunk(0), hit, values.take(pa.array(src))),
        "offset": pc.replace_with_mask(table.column("offset").chunk(0), hit, pa.array(offsets[src])),
        "timestamp": pc.replace_with_mask(
            table.column("timestamp").chunk(0),
            hit,
            pa.array(stamps, mask=stamps < 0).cast(datafile.TIMESTAMP),
        ),
    }
    return pa.table(columns, schema=datafile.SCHEMA)


def no_negative_timestamps(table: pa.Table) -> pa.Table:
    """Timestamps before 1970 become null, as the header's ``-1 = none`` makes them elsewhere."""
    ts = table.column("timestamp")
    low = pc.min(ts.cast(pa.int64())).as_py()
    if low is None or low >= 0:
        return table
    ints = ts.cast(pa.int64())
    fixed = pc.if_else(pc.less(ints, 0), pa.scalar(None, pa.int64()), ints).cast(datafile.TIMESTAMP)
    return table.set_column(table.schema.get_field_index("timestamp"), "timestamp", fixed)
