"""What a run tells whoever watches it: callbacks, never prints.

The library says what happens; the CLI (or a service's logging) decides how to show it. Every
method of :class:`MaterializeProgress` does nothing but :meth:`~MaterializeProgress.engine_chosen`,
which logs the engine and its reason (a run says them once, to its listener: the CLI's prints
the line instead of logging it), so a listener overrides only what it shows.
Calls come from the thread that called :func:`~statesnap.run.materialize` (the Spark
bootstrap's task counts from a reporting thread of its own).
"""

from __future__ import annotations

import logging
from enum import StrEnum

from statesnap.run.engine import EngineChoice

__all__ = ["MaterializeProgress", "Stage"]

log = logging.getLogger(__name__)


class Stage(StrEnum):
    """Where a run is: what an interruption now would interrupt."""

    #: A Spark session is starting (nothing to cancel yet).
    SESSION_STARTING = "the Spark session was starting"
    #: The Spark engine's batch job reads the input.
    READING = "the table was being read"
    #: The Python engine restores and catches up with the input (a stop request now ends the
    #: catch-up between two batches with a checkpoint of what was read).
    CATCHING_UP = "the input was being caught up with"
    #: The Spark engine's streaming query is starting.
    QUERY_STARTING = "the streaming query was starting"
    #: Following the topic, checkpointing on the interval, until asked to stop.
    FOLLOWING = "following"
    #: The final checkpoint of a follow run is being written.
    FINAL_CHECKPOINT = "the final checkpoint was being written"
    #: The checkpoint is committed; the result is being gathered.
    COMMITTED = "the checkpoint was committed"


class MaterializeProgress:
    """Listener for a run's progress (a table's or a processor's); every method but
    :meth:`engine_chosen` (logged) is a no-op here."""

    def engine_chosen(self, choice: EngineChoice) -> None:
        """The engine for this run, and why: told once per run, logged here."""
        log.info("engine %s: %s", choice.engine, choice.reason)

    def stage(self, stage: Stage) -> None:
        """The run entered *stage*."""

    def status(self, line: str) -> None:
        """One sentence for a person (what a follow run does until stopped)."""

    def replay_started(self, label: str) -> None:
        """The Python engine starts restoring and replaying (``replaying <topic>``)."""

    def replay(
        self, records: int, partitions_done: int, partitions_total: int, estimated_total: int | None
    ) -> None:
        """Records replayed so far, partitions at their end, and the records the replay is
        estimated to read in all (from high watermarks: an estimate, never shrinking; None until
        known)."""

    def replay_finished(self, records: int, label: str) -> None:
        """The replay reached every partition's end having read *records* (``restored <table>``)."""

    def job_started(self, label: str) -> None:
        """Work of unknown size starts (``bootstrapping <topic>``, ``materializing <topic>``)."""

    def job(self, detail: str) -> None:
        """How the work of :meth:`job_started` stands (tasks done, records read, batches)."""

    def job_finished(self) -> None:
        """The work of :meth:`job_started` ended (finished, failed or stopped)."""
