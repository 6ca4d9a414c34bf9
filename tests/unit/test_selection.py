"""Which checkpoint a restore may continue from: retention, compaction and identity.

The dev broker (Tansu) never runs retention or compaction, its ``delete_records`` crashes the
request and ``describe_configs`` only returns explicit settings, so these Kafka behaviours are
proven here on a precise fake of the cluster's answers: a :class:`TopicState` holding exactly what
``Table.start`` reads from the cluster (cluster id, partitions, log-start offsets = low
watermarks, ``cleanup.policy`` and ``delete.retention.ms``). The same rules on a broker that
really deletes, compacts and recreates: tests/integration/apache/test_retention.py,
test_compaction.py and test_topic_id.py (Apache Kafka 4.1.1); here every edge case stays cheap.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from statesnap.checkpoint.manifest import CheckpointState
from statesnap.checkpoint.selection import (
    TopicState,
    check_identity,
    resume_offsets,
    unusable_reason,
)
from statesnap.errors import CheckpointMismatchError

from .conftest import T0, make_manifest

DAY_MS = 86_400_000


def _state(log_start: dict[int, int] | None = None, **kw: object) -> TopicState:
    base: dict[str, object] = {
        "topic": "orders-changelog",
        "cluster_id": "cluster-a",
        "partitions": (0, 1),
        "log_start": {0: 0, 1: 0} if log_start is None else log_start,
    }
    base.update(kw)
    return TopicState(**base)  # type: ignore[arg-type]


def test_fresh_checkpoint_on_an_untouched_log_is_usable() -> None:
    assert unusable_reason(make_manifest(), _state(), T0) is None


def test_log_start_beyond_the_checkpoint_offset_is_a_reason() -> None:
    """Kafka behaviour: time/size retention (cleanup.policy=delete) deletes whole segments and
    advances the log-start offset (the low watermark). A checkpoint resuming at offset 10 when
    partition 1's log now starts at 25 never saw records 10..24 and can no longer read them, so
    restore + tail would differ from what the records it missed did. Proven on a fake TopicState
    whose log_start says 25 for partition 1 (the dev broker never runs retention)."""
    m = make_manifest(offsets={0: 10, 1: 20})
    reason = unusable_reason(m, _state({0: 0, 1: 25}), T0)
    assert reason is not None
    assert "partition 1" in reason
    assert "20" in reason
    assert "25" in reason
    assert "retention" in reason


def test_log_start_at_or_below_the_checkpoint_offset_is_fine() -> None:
    """Kafka behaviour: retention that only removed records the checkpoint already contains
    (log start <= next offset) loses nothing; the tail still starts at a stored offset. Proven
    on a fake TopicState with log_start equal to and below the checkpoint's next offsets."""
    m = make_manifest(offsets={0: 10, 1: 20})
    assert unusable_reason(m, _state({0: 10, 1: 19}), T0) is None


def test_a_partition_the_cluster_no_longer_reports_is_not_a_reason() -> None:
    m = make_manifest(offsets={0: 10, 1: 20, 7: 3})
    assert unusable_reason(m, _state({0: 0, 1: 0}), T0) is None


def test_compacted_topic_with_checkpoint_older_than_delete_retention_is_a_reason() -> None:
    """Kafka behaviour: on a compacted topic (cleanup.policy=compact) the cleaner removes a
    tombstone once it is older than delete.retention.ms. A checkpoint older than that may hold a
    key whose tombstone the tail will no longer deliver: restoring it would resurrect a deleted
    key. Proven on a fake TopicState (compacted, delete.retention.ms=1 day) and a manifest whose
    created_at is 25 h before the injected clock (the dev broker never compacts)."""
    m = make_manifest(created_at=T0)
    state = _state(compacted=True, delete_retention_ms=DAY_MS)
    reason = unusable_reason(m, state, T0 + timedelta(hours=25))
    assert reason is not None
    assert "compacted" in reason
    assert "delete.retention.ms=86400000" in reason
    assert "tombstone" in reason


def test_compacted_topic_with_a_young_checkpoint_is_fine() -> None:
    """Kafka behaviour: tombstones younger than delete.retention.ms are still in the log, so a
    checkpoint younger than that sees every deletion in its tail. Proven on the same fake with a
    checkpoint 23 h old."""
    m = make_manifest(created_at=T0)
    state = _state(compacted=True, delete_retention_ms=DAY_MS)
    assert unusable_reason(m, state, T0 + timedelta(hours=23)) is None


def test_old_checkpoint_on_a_delete_policy_topic_is_fine() -> None:
    """Kafka behaviour: without compaction no single record is removed from the middle of the
    log, so the checkpoint's age does not matter (only the log-start offset does). Proven on a
    fake TopicState with compacted=False and a 30-day-old checkpoint."""
    m = make_manifest(created_at=T0)
    assert unusable_reason(m, _state(delete_retention_ms=1), T0 + timedelta(days=30)) is None


@pytest.mark.parametrize("state", [CheckpointState.CREATED, CheckpointState.FAILED])
def test_unfinished_or_failed_manifests_are_not_usable(state: CheckpointState) -> None:
    reason = unusable_reason(make_manifest(state=state), _state(), T0)
    assert reason is not None
    assert state.value in reason


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"topic": "payments-changelog"}, "payments-changelog"),
        ({"cluster_id": "cluster-b"}, "cluster-b"),
        ({"table": "other-table"}, "other-table"),
    ],
)
def test_identity_mismatch_is_refused(changes: dict[str, str], named: str) -> None:
    """A checkpoint under this table's directory that was written for another topic, cluster
    or table is refused with an error (not skipped): restoring it would build a wrong table,
    and silently replaying would hide a configuration mistake."""
    m = make_manifest(3, **changes)  # type: ignore[arg-type]
    with pytest.raises(CheckpointMismatchError) as info:
        check_identity(m, "orders", _state())
    msg = str(info.value)
    assert named in msg
    assert "orders-changelog" in msg
    assert "generation 3" in msg


def test_identity_match_passes() -> None:
    check_identity(make_manifest(), "orders", _state())


def test_resume_offsets_replays_new_partitions_from_the_beginning() -> None:
    """Kafka behaviour: CreatePartitions adds empty partitions to an existing topic; records
    produced to them after a checkpoint are not in it. Restoring must resume the known
    partitions at the checkpoint's next offsets and read every new partition from offset 0.
    Proven on a manifest of partitions {0, 1} against a topic now reporting {0, 1, 2, 3}
    (the dev broker rejects CreatePartitions with UNSUPPORTED_FEATURE)."""
    m = make_manifest(offsets={0: 10, 1: 20})
    assert resume_offsets(m, (0, 1, 2, 3)) == {0: 10, 1: 20, 2: 0, 3: 0}
    assert resume_offsets(None, (0, 1)) == {0: 0, 1: 0}
    assert resume_offsets(m, (1,)) == {1: 20}  # a table owning a subset resumes only those
