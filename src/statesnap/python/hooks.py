"""Callbacks a table runs on its own threads: updates, checkpoints, and restore progress.

Threading rules (all hooks):

- A hook runs **synchronously on a statesnap thread**; the table waits for it. Keep it short: hand
  heavy work to a queue or an executor. From an event loop, use ``loop.call_soon_threadsafe``.
- An exception a hook raises is **logged and swallowed** (``statesnap.task.hooks`` logger, ERROR with the
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
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from statesnap.serde import Serde
from statesnap.task.hooks import (
    Change,
    CheckpointHook,
    RestoreListener,
    RestoreTracker,
    call_safely,
    changes_of,
)

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


@dataclass(frozen=True, slots=True)
class Hooks:
    """A table's hooks, as one value (each is also an attribute, settable before ``start()``)."""

    on_update: UpdateHook[Any, Any] | None = None
    on_checkpoint: CheckpointHook | None = None
    restore_listener: RestoreListener | None = None


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
