"""The order in which a task's co-partitioned inputs reach its handler: a greedy head merge.

Per task (partition p), the next record is the head (the oldest unread record) of the input whose
head has the smallest timestamp, ties going to the input listed first (within one input, offset
order is kept). A head is taken only while every input's head is known, or that input is at the
end of its partition: an input whose next record is not fetched yet could hold an older one.

Why this rule: it is a function of the inputs' positions alone (it keeps no memory of what came
before), so a restore that resumes every input at its checkpointed offset and merges the tails
takes exactly the steps a full run takes from that point — ``restore + process(tail) ==
process(everything)`` — whenever the checkpoint lies on that run's path. It does for checkpoints
written while catching up with input that already existed; a processor that keeps following
reads what arrives (an input at its end is not waited for), so across inputs its order is then
the order of arrival, as in Kafka Streams with ``max.task.idle.ms=0``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["merge", "pick"]


def pick(heads: Sequence[int | None], ended: Sequence[bool]) -> int | None:
    """The input whose head goes next, or None to wait for a fetch.

    *heads*: per input, its head's timestamp, None when it has no head buffered; *ended*: per
    input, whether it is at the end of its partition (only read where *heads* is None). Inputs
    with no head that have ended take no part; one with no head that has not ended makes the
    merge wait; no head at all is None too."""
    best: int | None = None
    best_ts = 0
    for i, ts in enumerate(heads):
        if ts is None:
            if not ended[i]:
                return None
        elif best is None or ts < best_ts:
            best, best_ts = i, ts
    return best


def merge(timestamps: Sequence[Sequence[int]], start: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The merge of complete inputs (each a sequence of record timestamps in offset order) from
    positions *start* (default: the beginning) to their ends, as (input, index) pairs: the
    order a task that has read everything hands records to its handler."""
    positions = list(start) if start is not None else [0] * len(timestamps)
    order: list[tuple[int, int]] = []
    ended = [True] * len(timestamps)
    while True:
        heads = [ts[pos] if pos < len(ts) else None for ts, pos in zip(timestamps, positions, strict=True)]
        i = pick(heads, ended)
        if i is None:
            return order
        order.append((i, positions[i]))
        positions[i] += 1
