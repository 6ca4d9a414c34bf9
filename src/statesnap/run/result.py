"""What a run did, as one typed value both engines return: a table's :class:`MaterializeResult`, and
a processor's :class:`ProcessorRunResult` (the same figures plus what its own code did).

``to_json()`` gives the keys ``statesnap materialize --json`` has always printed, the same on
both engines; ``summary()`` the sentence a person reads. Figures are this run's, measured: the
checkpoint's own ``writer`` metadata may describe another run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from statesnap.checkpoint import CheckpointManifest
from statesnap.run.engine import EngineChoice
from statesnap.task.restore import RestoreReport

__all__ = ["Followed", "MaterializeResult", "ProcessorRunResult", "RestoreFigures", "records_between"]


@dataclass(frozen=True, slots=True)
class RestoreFigures:
    """How the run got to the topic's end: the checkpoint it resumed from (None: the start of
    the topic), the records it read after it and the seconds that took."""

    checkpoint: int | None
    replayed_records: int
    restore_seconds: float

    @classmethod
    def of(cls, report: RestoreReport) -> RestoreFigures:
        return cls(report.checkpoint, report.replayed_records, report.restore_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "replayed_records": self.replayed_records,
            "restore_seconds": round(self.restore_seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class Followed:
    """A follow run after its restore: records read and seconds followed, so neither the whole
    run's time nor the final checkpoint's passes for it."""

    records: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True, slots=True)
class MaterializeResult:
    """One materialization, whichever engine ran it.

    ``checkpoint`` is the generation the table now stands at (written by this run when
    ``written``, else the newest before it; None when there is none), with its ``offsets``
    (next offsets to consume), size in ``bytes`` and ``keys`` (the table's key count, not the
    files' rows). ``checkpoint_seconds`` is the commit of this run's (final) checkpoint;
    ``seconds`` the whole run. ``url`` is the table's directory as an absolute identity (what
    ``--json`` prints, what scripts compare); ``shown`` the same directory under the location as
    the user gave it (``./ckpt/…``), which the summary prints: a person recognises their own path.
    """

    table: str
    topic: str
    engine: EngineChoice
    checkpoint: int | None
    written: bool
    keys: int
    offsets: Mapping[int, int]
    restore: RestoreFigures
    checkpoint_seconds: float
    seconds: float
    bytes: int
    url: str | None
    followed: Followed | None = None
    shown: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", MappingProxyType(dict(self.offsets)))

    def __repr__(self) -> str:
        """One short line (the fields are :meth:`to_json`'s): a REPL shows what happened."""
        return (
            f"MaterializeResult(table={self.table!r}, engine={self.engine.engine.value}, "
            f"checkpoint={self.checkpoint}, written={self.written}, keys={self.keys:,}, "
            f"seconds={self.seconds:.2f})"
        )

    @classmethod
    def of(
        cls,
        manifest: CheckpointManifest | None,
        *,
        table: str,
        topic: str,
        engine: EngineChoice,
        written: bool,
        keys: int,
        restore: RestoreReport,
        checkpoint_seconds: float,
        seconds: float,
        url: str | None,
        followed: Followed | None = None,
        shown: str | None = None,
    ) -> MaterializeResult:
        """The result of a run that leaves the table at *manifest* (None: no checkpoint)."""
        return cls(
            table=table,
            topic=topic,
            engine=engine,
            checkpoint=manifest.generation if manifest is not None else None,
            written=written,
            keys=keys,
            offsets=manifest.offsets if manifest is not None else {},
            restore=RestoreFigures.of(restore),
            checkpoint_seconds=checkpoint_seconds,
            seconds=seconds,
            bytes=manifest.total_bytes if manifest is not None else 0,
            url=url,
            followed=followed,
            shown=shown,
        )

    def to_json(self) -> dict[str, Any]:
        """``statesnap materialize --json``: the same keys on both engines (``followed`` only
        for a follow run)."""
        return {
            "table": self.table,
            "topic": self.topic,
            "engine": str(self.engine.engine),
            "checkpoint": self.checkpoint,
            "written": self.written,
            "keys": self.keys,
            "offsets": dict(self.offsets),
            "restore": self.restore.to_json(),
            "checkpoint_seconds": round(self.checkpoint_seconds, 3),
            "seconds": round(self.seconds, 3),
            "bytes": self.bytes,
            "url": self.url,
            **({"followed": self.followed.to_json()} if self.followed is not None else {}),
            "engine_reason": self.engine.reason,
        }

    def summary(self) -> str:
        """The sentence for a person. A one-shot run reads and writes in the time it gives; a
        follow run says how long it followed and what it read in that time, and how long the
        final checkpoint took, so neither number is the other's."""
        if not self.written:
            return f"no new records since checkpoint {self.checkpoint}; nothing written"
        base = self.restore.checkpoint
        since = f"after checkpoint {base}" if base is not None else "from the start of the topic"
        head = f"checkpoint {self.checkpoint} of {self.table} by {self.engine.engine}: "
        size = f"{self.keys:,} keys, {self.bytes:,} bytes"
        where = self.shown if self.shown is not None else self.url
        if self.followed is None:
            read = f"read {self.restore.replayed_records:,} records {since}"
            return f"{head}{size} in {round(self.seconds, 3):.2f}s ({read}) → {where}"
        records = self.restore.replayed_records + self.followed.records
        return (
            f"{head}{size}, written in {round(self.checkpoint_seconds, 3):.2f}s after following for "
            f"{round(self.followed.seconds, 3):.2f}s (read {records:,} records {since}) → {where}"
        )


@dataclass(frozen=True, slots=True)
class ProcessorRunResult:
    """One run of a processor: the table-run figures (``materialize``'s, key for key), and what the
    processor's own code did in this run: records ``processed`` (the tail included), records
    ``emitted`` and ``dead_lettered``, rows per store at the end of the run (``stores``), records
    a declared step skipped (``skipped``: no key, a tombstone where none counts), and records
    processed for their state only (``state_only``: with exactly-once, the tail between the
    checkpoint and the committed offsets, whose outputs were committed before; their emits are
    not sent again)."""

    run: MaterializeResult
    processed: int
    emitted: int
    dead_lettered: int
    stores: Mapping[str, int]
    skipped: int = 0
    state_only: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "stores", MappingProxyType(dict(self.stores)))

    def __repr__(self) -> str:
        return (
            f"ProcessorRunResult(processor={self.run.table!r}, engine={self.run.engine.engine.value}, "
            f"checkpoint={self.run.checkpoint}, processed={self.processed:,}, emitted={self.emitted:,}, "
            f"stores={dict(self.stores)!r})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.run.to_json(),
            "processed": self.processed,
            "emitted": self.emitted,
            "dead_lettered": self.dead_lettered,
            "skipped": self.skipped,
            "state_only": self.state_only,
            "stores": dict(self.stores),
        }

    def summary(self) -> str:
        stores = ", ".join(f"{n} {k:,}" for n, k in self.stores.items()) or "no stores"
        again = f" ({self.state_only:,} for their state only)" if self.state_only else ""
        return (
            f"{self.run.summary()}; processed {self.processed:,} records{again}, emitted {self.emitted:,}, "
            f"dead-lettered {self.dead_lettered:,}, skipped {self.skipped:,}; rows per store: {stores}"
        )


def records_between(start: Mapping[int, int], end: Mapping[int, int]) -> int:
    """Records read from *start* to *end* (next offsets), over the partitions held at both ends (a
    partition a group member gained meanwhile was restored, not read from *start*). Offsets count
    records exactly on the dev broker; on Kafka, transaction markers and compacted gaps make it an
    upper bound."""
    return sum(max(0, end[p] - start[p]) for p in start.keys() & end.keys())
