"""Event-time windows: tumbling and hopping, with a grace period and a retention.

A window ``[start, start + size)`` takes records while stream time is below ``start + size +
grace`` (later ones are *late* and dropped, as in Kafka Streams), and is deleted from its store
— and so from the next checkpoint — once stream time reaches ``start + retention``. Stream time
comes from records (the largest timestamp a task has seen), never from the wall clock, so a
restore and a full re-processing close and drop the same windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from statesnap.durations import parse_duration
from statesnap.errors import ConfigError

__all__ = ["Windows"]


def _ms(value: str | float | timedelta, what: str) -> int:
    ms = round(parse_duration(value) / timedelta(milliseconds=1))
    if ms < 0:
        raise ConfigError(f"window {what} must not be negative, got {value!r}")
    return ms


@dataclass(frozen=True, slots=True)
class Windows:
    """A window specification (milliseconds); build one with :meth:`tumbling` or :meth:`hopping`."""

    size_ms: int
    advance_ms: int
    grace_ms: int = 0
    retention_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ConfigError(f"window size must be positive, got {self.size_ms} ms")
        if not 0 < self.advance_ms <= self.size_ms:
            raise ConfigError(
                f"window advance must be positive and at most the size ({self.size_ms} ms), "
                f"got {self.advance_ms} ms"
            )
        if self.grace_ms < 0:
            raise ConfigError(f"window grace must not be negative, got {self.grace_ms} ms")
        if self.retention_ms == 0:
            object.__setattr__(self, "retention_ms", self.size_ms + self.grace_ms)
        elif self.retention_ms < self.size_ms + self.grace_ms:
            raise ConfigError(
                f"window retention ({self.retention_ms} ms) must be at least size + grace "
                f"({self.size_ms + self.grace_ms} ms): a window still open would be dropped"
            )

    @classmethod
    def tumbling(
        cls,
        size: str | float | timedelta,
        *,
        grace: str | float | timedelta = 0,
        retention: str | float | timedelta | None = None,
    ) -> Windows:
        """Back-to-back windows of *size*; each record falls in exactly one."""
        size_ms = _ms(size, "size")
        return cls(size_ms, size_ms, _ms(grace, "grace"), _ms(retention, "retention") if retention else 0)

    @classmethod
    def hopping(
        cls,
        size: str | float | timedelta,
        *,
        advance: str | float | timedelta,
        grace: str | float | timedelta = 0,
        retention: str | float | timedelta | None = None,
    ) -> Windows:
        """Windows of *size* starting every *advance*; a record falls in ``size / advance`` of them."""
        return cls(
            _ms(size, "size"),
            _ms(advance, "advance"),
            _ms(grace, "grace"),
            _ms(retention, "retention") if retention else 0,
        )

    def starts(self, timestamp: int) -> list[int]:
        """Starts of the windows holding *timestamp*, oldest first; none starts below 0 (the
        epoch), as in Kafka Streams."""
        advance = self.advance_ms
        first = max((timestamp - self.size_ms) // advance + 1, 0)
        last = timestamp // advance
        return [k * advance for k in range(first, last + 1)]

    def closed(self, start: int, stream_time: int) -> bool:
        """Whether the window takes no more records (its end plus grace has passed)."""
        return stream_time >= start + self.size_ms + self.grace_ms

    def expired(self, start: int, stream_time: int) -> bool:
        """Whether the window is past retention: gone from the store and from checkpoints."""
        return stream_time >= start + self.retention_ms

    def to_json(self) -> dict[str, int]:
        return {
            "size_ms": self.size_ms,
            "advance_ms": self.advance_ms,
            "grace_ms": self.grace_ms,
            "retention_ms": self.retention_ms,
        }
