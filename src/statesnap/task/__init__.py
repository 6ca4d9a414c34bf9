"""The stateful-task core every writer and reader of a table goes through, on either engine.

- :mod:`statesnap.task.opening`: open a task — the cluster's facts, the checkpoint repository,
  the descriptor, the base checkpoint and the snapshot participant (one place for all writers);
- :mod:`statesnap.task.restore`: load a checkpoint into local stores and report what happened
  (one place for every restore into a store).
"""

from __future__ import annotations

from statesnap.task.restore import ProgressCallback, RestoreReport

__all__ = ["ProgressCallback", "RestoreReport"]
