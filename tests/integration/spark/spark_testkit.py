"""Ground-truth helpers shared by the Spark tests (a module, so tests can import it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from statesnap.digest import table_digest


@dataclass(frozen=True)
class Delivered:
    """One record as the broker acknowledged it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def replay(records: Sequence[Delivered]) -> dict[bytes, bytes]:
    """Full replay of the delivered changelog: newest value per key, tombstones delete."""
    table: dict[bytes, bytes] = {}
    for rec in sorted(records, key=lambda d: (d.partition, d.offset)):
        if rec.key is None:
            continue
        if rec.value is None:
            table.pop(rec.key, None)
        else:
            table[rec.key] = rec.value
    return table


def digest(table: dict[bytes, bytes]) -> tuple[str, int]:
    return table_digest(table.items())


def changelog(
    n: int, *, partitions: int, keys: int, seed: int = 0, tombstone_every: int = 7
) -> list[tuple[int, bytes | None, bytes | None]]:
    """A deterministic changelog; a key always lives in the same partition, as Kafka keys do."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(n):
        k = (i * 7919 + seed) % keys
        key = b"key-%d" % k
        value = None if i % tombstone_every == 3 else b"v-%d-%d" % (seed, i)
        out.append((k % partitions, key, value))
    return out
