"""The stateful-task core every writer and reader of a table goes through, on either engine, and
the Python engine itself.

- :mod:`statesnap.task.engine`: :class:`~statesnap.task.engine.Task`, one task in this process —
  handed a :class:`~statesnap.task.handler.TaskHandler` (a table's upserts, a processor's code), it
  owns restore, catch-up, the loop (:mod:`~statesnap.task.loop`), commit points and checkpoints
  (:mod:`~statesnap.task.commits`, :mod:`~statesnap.task.writer`: what a read-only task lacks), the
  consumer-group side (:mod:`~statesnap.task.group`) and close; :mod:`~statesnap.task.spec` is
  what a task is, as one value;
- :mod:`statesnap.task.opening`: open a task — the cluster's facts, the checkpoint repository,
  the descriptor, the base checkpoint and the snapshot participant (one place for all writers);
- :mod:`statesnap.task.restore`: load a checkpoint into local stores and report what happened
  (one place for every restore into a store).
"""

from __future__ import annotations

from statesnap.task.restore import ProgressCallback, RestoreReport

__all__ = ["ProgressCallback", "RestoreReport"]
