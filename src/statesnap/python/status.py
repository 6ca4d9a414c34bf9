"""``FollowerStatus``: what a follower holds and how fresh it is, as one value (``statesnap serve``'s
``/health`` and ``/metrics`` and ``--json`` print it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statesnap.task.lifecycle import TaskPhase

__all__ = ["FollowerStatus"]


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    """A point-in-time view of a follower: what it holds and how fresh it is.

    ``offsets`` are the next offset to consume per partition (everything below is applied);
    ``lag`` is records behind per partition (0 at EOF; an estimate otherwise). ``restore_seconds``
    and ``checkpoint_generation`` describe the boot (``checkpoint_generation`` is None after a full
    replay). ``last_update_age`` is seconds since the replica last applied a record;
    ``newest_record_age`` is seconds since the newest applied record's own timestamp.
    """

    table: str
    topic: str
    state: TaskPhase
    caught_up: bool
    offsets: Mapping[int, int]
    lag: Mapping[int, int]
    keys: int
    checkpoint_generation: int | None
    restore_seconds: float | None
    replayed_records: int
    last_update_age: float | None
    newest_record_age: float | None
    error: str | None = None

    @property
    def ready(self) -> bool:
        """Restored, caught up once, and the background consumer is healthy."""
        return self.state == TaskPhase.RUNNING

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())

    def to_json(self) -> dict[str, Any]:
        def rounded(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "table": self.table,
            "topic": self.topic,
            "state": str(self.state),
            "ready": self.ready,
            "caught_up": self.caught_up,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "lag": {str(p): n for p, n in sorted(self.lag.items())},
            "total_lag": self.total_lag,
            "keys": self.keys,
            "checkpoint_generation": self.checkpoint_generation,
            "restore_seconds": rounded(self.restore_seconds),
            "replayed_records": self.replayed_records,
            "last_update_age": rounded(self.last_update_age),
            "newest_record_age": rounded(self.newest_record_age),
            "error": self.error,
        }
