"""What a task tells the code around it while it restores and runs: restore progress per
partition (:class:`RestoreListener`, fed by :class:`RestoreTracker`), applied changes in stored
bytes (:data:`Change`), and the rule that a hook never stops the task (:func:`call_safely`).

The user-facing rules (which thread, when) are in :mod:`statesnap.python.hooks`, which re-exports
these; they live here because the engine (:mod:`statesnap.task.engine`) runs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.stores import StateStore
from statesnap.stores.base import Record

__all__ = ["Change", "CheckpointHook", "RestoreListener", "RestoreTracker", "call_safely", "changes_of"]

log = logging.getLogger(__name__)

#: ``on_checkpoint(manifest)``: a snapshot this task took part in completed here.
CheckpointHook = Callable[[CheckpointManifest], None]

#: One applied change in stored bytes: (key, old value, new value), None for absent.
Change = tuple[bytes, bytes | None, bytes | None]


class RestoreListener:
    """Restore progress per partition (Kafka Streams' ``StateRestoreListener``); subclass it and
    override what you need, every method does nothing by default."""

    def on_restore_start(self, partition: int, start_offset: int) -> None:
        """The replay of *partition* starts at *start_offset* (the checkpoint is loaded)."""

    def on_batch_restored(self, partition: int, batch_end_offset: int, records: int) -> None:
        """A batch of *records* up to *batch_end_offset* (inclusive) of *partition* was applied."""

    def on_restore_end(self, partition: int, total_records: int) -> None:
        """*partition* reached its end after *total_records* replayed records."""


def call_safely(what: str, table: str, hook: Callable[..., Any], *args: Any) -> None:
    """Run a hook; log (never raise) what it raises, so the table keeps going."""
    try:
        hook(*args)
    except Exception:
        log.exception("table %s: %s hook raised; ignored", table, what)


class RestoreTracker:
    """Feeds a :class:`RestoreListener` from the replay loop of ``start()``."""

    def __init__(self, listener: RestoreListener, table: str, start: Mapping[int, int]) -> None:
        self.listener = listener
        self.table = table
        self.records = dict.fromkeys(start, 0)
        self.ended: set[int] = set()
        for partition, offset in sorted(start.items()):
            call_safely("on_restore_start", table, listener.on_restore_start, partition, offset)

    def batch(self, partition: int, end_offset: int, records: int) -> None:
        self.records[partition] = self.records.get(partition, 0) + records
        call_safely(
            "on_batch_restored", self.table, self.listener.on_batch_restored, partition, end_offset, records
        )

    def at_end(self, partitions: Iterable[int]) -> None:
        """Report partitions at their end for the first time."""
        for partition in sorted(set(partitions) - self.ended):
            self.ended.add(partition)
            call_safely(
                "on_restore_end",
                self.table,
                self.listener.on_restore_end,
                partition,
                self.records.get(partition, 0),
            )


def changes_of(store: StateStore, records: list[Record]) -> list[Change]:
    """(key, old, new) per record of a batch, old as of just before it; read from *store* before
    the batch is applied. A tombstone for an absent key changes nothing and is left out."""
    seen: dict[bytes, bytes | None] = {}
    out: list[Change] = []
    get = store.get
    for key, value, _offset, _ts in records:
        old = seen[key] if key in seen else get(key)
        seen[key] = value
        if old is not None or value is not None:
            out.append((key, old, value))
    return out
