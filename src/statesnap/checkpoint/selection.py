"""Which checkpoint may a restore continue from? The two traps and the identity checks.

Pure functions over what the cluster reports, so every edge case (retention, compaction) can be
tested against a precise fake of the broker's answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from statesnap.checkpoint.manifest import CheckpointManifest, CheckpointState
from statesnap.errors import CheckpointMismatchError

__all__ = ["TopicState", "beyond_end", "check_identity", "resume_offsets", "unusable_reason"]


@dataclass(frozen=True, slots=True)
class TopicState:
    """The cluster's answers a restore decision needs."""

    topic: str
    cluster_id: str
    partitions: tuple[int, ...]
    log_start: Mapping[int, int]
    compacted: bool = False
    delete_retention_ms: int = 86_400_000
    #: The true end of each partition (found by partition EOF), where the reader knows it.
    log_end: Mapping[int, int] | None = None
    #: Kafka's topic ID, where the broker reports one: it changes when the topic is recreated.
    topic_id: str | None = None


def beyond_end(manifest: CheckpointManifest, state: TopicState | None) -> str | None:
    """Why *manifest* cannot be of this topic's incarnation: it resumes a partition past the
    partition's end (the topic was deleted and recreated, or another cluster reuses the id)."""
    if state is None:
        return None
    if manifest.topic_id and state.topic_id and manifest.topic_id != state.topic_id:
        return (
            f"it was taken from topic ID {manifest.topic_id}, the topic now has ID {state.topic_id}: "
            "another incarnation of the topic (deleted and recreated)"
        )
    if state.log_end is None:
        return None
    for p, pc in sorted(manifest.partitions.items()):
        end = state.log_end.get(p)
        if end is not None and pc.next_offset > end:
            return (
                f"partition {p} resumes at offset {pc.next_offset}, past the partition's end ({end}): "
                "the checkpoint belongs to another incarnation of the topic (deleted and recreated?), or an "
                "unclean broker restart truncated the log below it"
            )
    return None


def check_identity(manifest: CheckpointManifest, table: str, state: TopicState) -> None:
    """Refuse (not skip) a checkpoint of another topic or cluster stored under this table's name."""
    if manifest.topic != state.topic or manifest.cluster_id != state.cluster_id or manifest.table != table:
        raise CheckpointMismatchError(
            f"checkpoint generation {manifest.generation} belongs to table {manifest.table!r} of topic "
            f"{manifest.topic!r} on cluster {manifest.cluster_id!r}, not table {table!r} of topic "
            f"{state.topic!r} on cluster {state.cluster_id!r}; use another table name or location"
        )


def unusable_reason(manifest: CheckpointManifest, state: TopicState | None, now: datetime) -> str | None:
    """Why continuing from *manifest* would not equal a full replay, or None if it is safe.

    Without *state* (a reader with no access to the cluster) only the manifest itself is judged.
    """
    if manifest.state is not CheckpointState.COMPLETED:
        return f"state is {manifest.state.value}, not COMPLETED"
    if state is None:
        return None
    for p, pc in sorted(manifest.partitions.items()):
        start = state.log_start.get(p)
        if start is None:
            continue  # partition no longer reported; replaying what exists is still exact
        if pc.next_offset < start:
            return (
                f"partition {p} resumes at offset {pc.next_offset} but the log now starts at {start}: "
                "retention deleted records this checkpoint never saw"
            )
    if state.compacted:
        age_ms = manifest.age_seconds(now) * 1000
        if age_ms > state.delete_retention_ms:
            return (
                f"topic is compacted and the checkpoint is {age_ms / 1000:.0f}s old, older than "
                f"delete.retention.ms={state.delete_retention_ms}: compaction may have removed "
                "tombstones it needs, which would resurrect deleted keys"
            )
    return None


def resume_offsets(manifest: CheckpointManifest | None, partitions: tuple[int, ...]) -> dict[int, int]:
    """Next offset per partition: the checkpoint's, or 0 for partitions it does not know."""
    known = manifest.offsets if manifest is not None else {}
    return {p: known.get(p, 0) for p in partitions}
