"""Which checkpoint may a restore continue from? The traps and the identity checks.

Pure functions over what the cluster reports, so every edge case (retention, compaction, a log
truncated by an unclean leader election) can be tested against a precise fake of the broker's
answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from statesnap.checkpoint.manifest import CheckpointManifest, CheckpointState, NextOffset, leader_epoch_of
from statesnap.errors import CheckpointMismatchError

__all__ = [
    "EpochEnds",
    "TopicState",
    "beyond_end",
    "check_identity",
    "diverged",
    "resume_offsets",
    "same_incarnation",
    "unusable_reason",
]

#: Asks the cluster where leader epochs end (Kafka's OffsetForLeaderEpoch, KIP-320): given
#: positions that carry the epoch of the record before them, it answers the partitions whose log
#: no longer holds that epoch up to the position, with the epoch's end offset there (-1: the log
#: has no such epoch or an earlier one); partitions it found intact or could not judge are absent.
EpochEnds = Callable[[Mapping[int, NextOffset]], Mapping[int, int]]


@dataclass(frozen=True, slots=True)
class TopicState:
    """The cluster's answers a restore decision needs."""

    topic: str
    cluster_id: str
    partitions: tuple[int, ...]
    log_start: Mapping[int, int]
    compacted: bool = False
    delete_retention_ms: int = 86_400_000
    #: The true end of each partition (found by partition EOF), where the reader knows it. An end
    #: that is a :class:`NextOffset` carries the leader epoch of the log's last record: that
    #: epoch ends at the log end, so a checkpoint of the same epoch needs no question to the broker.
    log_end: Mapping[int, int] | None = None
    #: Kafka's topic ID, where the broker reports one: it changes when the topic is recreated.
    topic_id: str | None = None
    #: Where the cluster can be asked (see :data:`EpochEnds`); None judges no leader epochs.
    epoch_ends: EpochEnds | None = field(default=None, compare=False)


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
            cause = (
                "the topic ID is the checkpoint's, so an unclean broker restart or leader election "
                "truncated the log below it"
                if same_incarnation(manifest, state)
                else "the checkpoint belongs to another incarnation of the topic (deleted and recreated?), "
                "or an unclean broker restart truncated the log below it"
            )
            return (
                f"partition {p} resumes at offset {pc.next_offset}, past the partition's end ({end}): {cause}"
            )
    return None


def same_incarnation(manifest: CheckpointManifest, state: TopicState | None) -> bool:
    """Whether *manifest* was taken from the topic incarnation *state* describes, by topic ID;
    False where either side does not know it. A checkpoint of the same incarnation past a
    partition's end says the log was truncated, which says nothing of older checkpoints."""
    return bool(state is not None and manifest.topic_id and manifest.topic_id == state.topic_id)


def diverged(manifest: CheckpointManifest, state: TopicState | None) -> str | None:
    """Why *manifest*'s offsets name records the log no longer holds, or None (KIP-320).

    An unclean leader election (or a single broker's recovery after a torn write) truncates a
    partition's log and the next leader epoch writes new records at the lost offsets: once they
    carry the end past a checkpoint's offset, offsets alone look valid. The leader epoch kept with
    each offset tells: if the log holds that epoch only up to an offset below the checkpoint's,
    the checkpoint saw records that are gone, and continuing would skip or repeat records.

    Asked only for partitions this restore reads whose epoch is known and is not the epoch at the
    log's end (which ends at the log end, judged by :func:`beyond_end`); never without a cluster.
    """
    if state is None or state.epoch_ends is None:
        return None
    asked: dict[int, NextOffset] = {}
    for p, pc in sorted(manifest.partitions.items()):
        if pc.leader_epoch is None or p not in state.partitions:
            continue
        end = state.log_end.get(p) if state.log_end is not None else None
        if end is not None and leader_epoch_of(end) == pc.leader_epoch and pc.next_offset <= end:
            continue
        asked[p] = NextOffset(pc.next_offset, pc.leader_epoch)
    if not asked:
        return None
    ends = state.epoch_ends(asked)
    for p, position in asked.items():
        epoch_end = ends.get(p)
        if epoch_end is None or epoch_end >= position:
            continue
        held = (
            f"the log knows no leader epoch {position.leader_epoch}"
            if epoch_end < 0
            else f"the log holds leader epoch {position.leader_epoch} only up to offset {epoch_end}"
        )
        return (
            f"partition {p} resumes at offset {int(position)} after a record of leader epoch "
            f"{position.leader_epoch}, but {held}: the log was truncated below the checkpoint (an unclean "
            "leader election or broker restart) and later records took those offsets"
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
    """Next offset per partition: the checkpoint's, or 0 for partitions it does not know. An
    offset whose leader epoch the checkpoint kept is a :class:`NextOffset`: a reader assigned
    there has the broker check its log still holds that epoch up to it."""
    known = manifest.partitions if manifest is not None else {}
    return {p: known[p].position if p in known else 0 for p in partitions}
