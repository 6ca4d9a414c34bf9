"""How a processor processes its records and hands its results on, as one value.

Kafka Streams keeps these three in ``StreamsConfig`` (``processing.guarantee``,
``errors.dead.letter.queue.topic.name``, ``max.task.idle.ms``); Quix Streams has
``processing_guarantee``. They travel together — a run chooses its guarantee, where failed
records go and how long a merge waits once, for every task — so :class:`~statesnap.Processor`
takes them as one keyword, ``processing=ProcessingOptions(...)``, and ``statesnap run``'s flags
override its fields.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from statesnap.durations import parse_duration
from statesnap.errors import ConfigError

__all__ = ["ProcessingOptions"]


@dataclass(frozen=True, slots=True, init=False)
class ProcessingOptions:
    """A processor's delivery guarantee, dead letters and merge wait.

    Args:
        exactly_once: emitted records and the input offsets commit in one Kafka transaction per
            commit point (a stable ``transactional.id`` per task; offsets of the group
            ``statesnap-<name>``); a restart re-processes the records between the checkpoint and
            those offsets for their state only. Readers use ``read_committed``; the broker must
            implement transactions. With ``group`` the offsets are the member's own group's, sent
            with its group metadata, so the coordinator fences a member a rebalance replaced
            (KIP-447); a partition's transaction commits before it leaves. Default: at least once.
        dead_letter_topic: where records a handler fails on go (with ``statesnap.error`` and
            origin headers) instead of stopping the processor; their store writes and emitted
            records are dropped.
        max_idle: with several inputs, once caught up, how long a task with records waiting
            waits for an input that has neither delivered its next record nor reported its end
            before it goes on without it (Kafka Streams' ``max.task.idle.ms``; default 500 ms).
        reemit_confirmed: with ``exactly_once`` and a restore of an exact generation
            (``CheckpointOptions(generation=G)``), say that the outputs of the records after G are
            produced again (they were committed once already); refused without it.
    """

    exactly_once: bool
    dead_letter_topic: str | None
    max_idle: timedelta
    reemit_confirmed: bool

    def __init__(
        self,
        *,
        exactly_once: bool = False,
        dead_letter_topic: str | None = None,
        max_idle: str | float | timedelta = "500ms",
        reemit_confirmed: bool = False,
    ) -> None:
        idle = parse_duration(max_idle)
        if idle < timedelta(0):
            raise ConfigError(f"max_idle must not be negative, got {max_idle!r}")
        if dead_letter_topic is not None and not (isinstance(dead_letter_topic, str) and dead_letter_topic):
            raise ConfigError(f"dead_letter_topic must be a topic name, got {dead_letter_topic!r}")
        set_ = object.__setattr__
        set_(self, "exactly_once", bool(exactly_once))
        set_(self, "dead_letter_topic", dead_letter_topic)
        set_(self, "max_idle", idle)
        set_(self, "reemit_confirmed", bool(reemit_confirmed))

    def with_exactly_once(self) -> ProcessingOptions:
        """The same options with exactly-once outputs (``statesnap run --exactly-once``)."""
        return replace(self, exactly_once=True)

    def with_reemit_confirmed(self) -> ProcessingOptions:
        """The same options with the re-emission after a rewind confirmed (``run --yes``)."""
        return replace(self, reemit_confirmed=True)

    def check_rewind(self, processor: str, generation: int | None) -> None:
        """Refuse to restore an exact *generation* with exactly-once outputs unless confirmed:
        the outputs after it were committed once and would be produced again."""
        if generation is not None and self.exactly_once and not self.reemit_confirmed:
            raise ConfigError(
                f"processor {processor!r}: restoring generation {generation} with exactly_once=True "
                f"produces the outputs of the records after it again (they were committed once); "
                "pass ProcessingOptions(..., reemit_confirmed=True) to go on"
            )
