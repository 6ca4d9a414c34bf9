"""Callbacks a table runs on its own threads: updates, checkpoints, and restore progress.

Threading rules (all hooks):

- A hook runs **synchronously on a statesnap thread**; the table waits for it. Keep it short: hand
  heavy work to a queue or an executor. From an event loop, use ``loop.call_soon_threadsafe``.
- An exception a hook raises is **logged and swallowed** (``statesnap.python.hooks`` logger, ERROR with the
  traceback): a broken hook never stops the table, loses a record or fails a checkpoint.
- A hook may read the table (``get``, ``items``…); it must not call ``close()``, ``start()`` or
  ``poll()`` of the table that runs it.

The hooks:

``on_update(key, old, new)``
    After a record from the changelog is applied *while the table runs* (after ``start()``
    returned), on the consuming thread: the background thread, or the thread calling ``poll()`` /
    ``wait_for()`` for ``background=False`` tables. Key and values are **deserialized** by the
    table's serdes (``old``/``new`` are None for an absent key and a tombstone); records are passed
    in offset order per partition, with ``old`` as of just before that record. The batch holding the
    record is already applied when the hook runs, so a read inside it may see later records of the
    same batch. A key or value the serde cannot decode is logged and skipped. The replay inside
    ``start()`` is a *restore* and is reported to the restore listener instead (Kafka Streams does
    the same: restoration does not forward records). Keys a ``key_filter`` rejects never reach it;
    ``new`` is the projected value when a ``value_projection`` is set.

``on_checkpoint(manifest)``
    After a snapshot this table took part in completes **in this process** (for a table owning all
    partitions: every checkpoint it writes), after retention GC, on the thread that completed it —
    the consuming thread at a commit point, the caller of ``checkpoint()`` or ``close()``, or the
    snapshot refresher thread when it finished a snapshot other instances reported to last.

:class:`RestoreListener`
    During ``start()``, on the thread running it (the caller's; a worker thread for
    ``start_async()`` and ``Follower.start_in_background()``), like Kafka Streams'
    ``StateRestoreListener``: ``on_restore_start(partition, start_offset)`` once per partition
    after the checkpoint is loaded (*start_offset* is the first offset the replay reads: the
    checkpoint's next offset, or 0), ``on_batch_restored(partition, batch_end_offset, records)``
    per replayed batch (offset of its last record, records in it), and
    ``on_restore_end(partition, total_records)`` when the partition first reaches its end
    (records replayed for it in total; rows loaded from the checkpoint are in
    :class:`~statesnap.task.restore.RestoreReport`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.serde import Serde
from statesnap.stores import StateStore
from statesnap.stores.base import Record

__all__ = [
    "Change",
    "CheckpointHook",
    "Hooks",
    "RestoreListener",
    "RestoreTracker",
    "UpdateHook",
    "call_safely",
    "changes_of",
    "fire_updates",
]

log = logging.getLogger(__name__)

K_contra = TypeVar("K_contra", contravariant=True)
V_contra = TypeVar("V_contra", contravariant=True)


class UpdateHook(Protocol[K_contra, V_contra]):
    """``on_update(key, old, new)``: see the module docstring for when and where it runs."""

    def __call__(self, key: K_contra, old: V_contra | None, new: V_contra | None, /) -> None: ...


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


@dataclass(frozen=True, slots=True)
class Hooks:
    """A table's hooks, as one value (each is also an attribute, settable before ``start()``)."""

    on_update: UpdateHook[Any, Any] | None = None
    on_checkpoint: CheckpointHook | None = None
    restore_listener: RestoreListener | None = None


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


def fire_updates(
    table: str, hook: UpdateHook[Any, Any], key_serde: Serde, value_serde: Serde, changes: list[Change]
) -> None:
    """Call ``on_update`` per change, deserialized; undecodable ones are logged and skipped."""
    kd, vd = key_serde.deserialize, value_serde.deserialize
    for key, old, new in changes:
        try:
            args = (kd(key), None if old is None else vd(old), None if new is None else vd(new))
        except Exception as e:
            log.warning("table %s: on_update skipped for key %r: cannot decode it: %s", table, key[:100], e)
            continue
        call_safely("on_update", table, hook, *args)
