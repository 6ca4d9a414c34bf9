"""Retention GC: the pure rule (Hypothesis, on an injectable clock) and collect_garbage on a
local blob store with a fake clock."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statesnap.blob import FileBlobStore
from statesnap.checkpoint import CheckpointRepository, layout
from statesnap.checkpoint.manifest import CheckpointManifest, DataFile, PartitionCheckpoint
from statesnap.checkpoint.retention import (
    CheckpointAge,
    RetentionPolicy,
    collect_garbage,
    retained_generations,
)
from statesnap.errors import ConfigError, InvalidDurationError

from .conftest import T0, rows

_ages = st.lists(
    st.builds(
        CheckpointAge,
        generation=st.integers(1, 10_000),
        # Not monotone in the generation: writers' clocks may disagree.
        created_at=st.integers(-5_000, 5_000).map(lambda s: T0 + timedelta(seconds=s)),
        usable=st.booleans(),
    ),
    max_size=25,
    unique_by=lambda c: c.generation,
)
_policies = st.builds(
    RetentionPolicy,
    min_count=st.integers(1, 8),
    min_age=st.integers(0, 8_000).map(lambda s: timedelta(seconds=s)),
    orphan_grace=st.just(timedelta(0)),
)


def _spec(cps: list[CheckpointAge], policy: RetentionPolicy, now: object, pinned: set[int]) -> set[int]:
    """The rule as DESIGN.md states it, written independently of the implementation."""
    newest_first = sorted(cps, key=lambda c: -c.generation)
    survivors = {c.generation for c in newest_first[: policy.min_count]}
    survivors |= {c.generation for c in cps if now - c.created_at < policy.min_age}  # type: ignore[operator]
    usable = [c.generation for c in newest_first if c.usable]
    survivors |= set(usable[:1])
    survivors |= {c.generation for c in cps if c.generation in pinned}
    return survivors


@settings(max_examples=400)
@given(
    cps=_ages,
    policy=_policies,
    now_offset=st.integers(-1_000, 20_000),
    pinned=st.sets(st.integers(1, 10_000), max_size=3),
)
def test_rule_keeps_exactly_newest_min_count_young_and_newest_usable(
    cps: list[CheckpointAge], policy: RetentionPolicy, now_offset: int, pinned: set[int]
) -> None:
    now = T0 + timedelta(seconds=now_offset)
    kept = retained_generations(cps, policy, now, keep=lambda g: g in pinned)
    assert kept == _spec(cps, policy, now, pinned)
    gens = {c.generation for c in cps}
    assert kept <= gens
    assert len(kept) >= min(policy.min_count, len(cps))
    if any(c.usable for c in cps):
        assert max(c.generation for c in cps if c.usable) in kept
    for c in cps:
        old = now - c.created_at >= policy.min_age
        rank = sorted(gens, reverse=True).index(c.generation)
        newest_usable = c.usable and not any(d.usable and d.generation > c.generation for d in cps)
        if old and rank >= policy.min_count and not newest_usable and c.generation not in pinned:
            assert c.generation not in kept


@given(cps=_ages, policy=_policies, now_offset=st.integers(-1_000, 20_000))
def test_rule_is_monotone_in_its_knobs(
    cps: list[CheckpointAge], policy: RetentionPolicy, now_offset: int
) -> None:
    """Asking for more (count or age) never deletes more; time passing never keeps more."""
    now = T0 + timedelta(seconds=now_offset)
    kept = retained_generations(cps, policy, now)
    more = RetentionPolicy(policy.min_count + 1, policy.min_age + timedelta(seconds=60), timedelta(0))
    assert kept <= retained_generations(cps, more, now)
    assert retained_generations(cps, policy, now + timedelta(hours=1)) <= kept


def test_rule_boundary_exactly_min_age_old_is_not_young() -> None:
    policy = RetentionPolicy(1, timedelta(seconds=60), timedelta(0))
    cps = [CheckpointAge(2, T0, True), CheckpointAge(1, T0 - timedelta(seconds=60), True)]
    assert retained_generations(cps, policy, T0) == {2}
    assert retained_generations(cps, policy, T0 - timedelta(microseconds=1)) == {1, 2}


def test_rule_keeps_the_newest_usable_even_beyond_min_count() -> None:
    policy = RetentionPolicy(2, timedelta(0), timedelta(0))
    cps = [
        CheckpointAge(5, T0, False),
        CheckpointAge(4, T0, False),
        CheckpointAge(3, T0, True),
        CheckpointAge(2, T0, True),
    ]
    assert retained_generations(cps, policy, T0) == {5, 4, 3}


@pytest.mark.parametrize(
    "kwargs",
    [{"min_count": 0}, {"min_count": -1}, {"min_count": 1.5}, {"min_count": "3"}],
)
def test_policy_rejects_bad_counts(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="min_count"):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_parses_durations_and_rejects_bad_ones() -> None:
    assert RetentionPolicy.of(3, "5m", "90s") == RetentionPolicy(
        3, timedelta(minutes=5), timedelta(seconds=90)
    )
    assert RetentionPolicy(min_age="2d").min_age == timedelta(days=2)  # type: ignore[arg-type]
    with pytest.raises(InvalidDurationError):
        RetentionPolicy.of(3, "-5m")
    with pytest.raises(InvalidDurationError):
        RetentionPolicy(orphan_grace="soon")  # type: ignore[arg-type]


# --- collect_garbage on a real (local) blob store, with a fake clock -------------------------------


def _commit(
    repo: CheckpointRepository, gen: int, created_s: int, *, reuse: dict[int, DataFile] | None = None
) -> CheckpointManifest:
    """Generation *gen*: partition 0 gets a new base file, partition 1 reuses *reuse*'s file
    (incremental checkpoints reference older files)."""
    f0 = repo.write_file(gen, 0, "base", 0, rows([(b"k%d" % gen, b"v", gen)]))
    f1 = repo.write_file(gen, 1, "base", 0, rows([(b"shared", b"v", 0)])) if reuse is None else reuse[1]
    m = CheckpointManifest(
        table="t",
        topic="t",
        cluster_id="c",
        generation=gen,
        partitions={0: PartitionCheckpoint(0, gen + 1, (f0,)), 1: PartitionCheckpoint(1, 1, (f1,))},
        created_at=T0 + timedelta(seconds=created_s),
    )
    repo.commit(m)
    return m


def _on_disk(repo: CheckpointRepository) -> set[str]:
    n = len(repo.directory) + 1
    return {b.key[n:] for b in repo.store.list(repo.directory + "/")}


@pytest.fixture
def repo(tmp_path: Path) -> CheckpointRepository:
    return CheckpointRepository(FileBlobStore(tmp_path / "root"), "c_t")


def test_collect_garbage_deletes_old_generations_but_keeps_shared_files(
    repo: CheckpointRepository,
) -> None:
    first = _commit(repo, 1, 0)
    shared = {1: first.partitions[1].files[0]}
    for gen in range(2, 7):
        _commit(repo, gen, gen * 100, reuse=shared)
    now = T0 + timedelta(seconds=10_000)
    report = collect_garbage(repo, RetentionPolicy(2, timedelta(0), timedelta(0)), now=now)
    assert report.retained == [6, 5]
    assert report.deleted_generations == [1, 2, 3, 4]
    assert repo.generations() == [6, 5]
    files = _on_disk(repo)
    # Generation 1's partition-1 file is still referenced by 5 and 6: it must survive.
    assert first.partitions[1].files[0].path in files
    referenced = {f.path for g in repo.generations() for f in repo.read_manifest(g).files}
    assert {f for f in files if f.startswith("data/")} == referenced
    assert all(repo.verify(g).ok for g in repo.generations())


def test_collect_garbage_dry_run_deletes_nothing(repo: CheckpointRepository) -> None:
    for gen in range(1, 5):
        _commit(repo, gen, gen)
    before = _on_disk(repo)
    report = collect_garbage(
        repo, RetentionPolicy(1, timedelta(0), timedelta(0)), now=T0 + timedelta(hours=1), dry_run=True
    )
    assert report.dry_run
    assert report.deleted_generations == [1, 2, 3]
    assert _on_disk(repo) == before


def test_collect_garbage_min_age_on_the_fake_clock(repo: CheckpointRepository) -> None:
    for gen in range(1, 6):
        _commit(repo, gen, gen * 60)  # one a minute
    policy = RetentionPolicy(1, timedelta(minutes=3), timedelta(0))
    report = collect_garbage(repo, policy, now=T0 + timedelta(seconds=5 * 60 + 30))
    # Younger than 3 min at t=5m30s: generations 3 (2m30s), 4, 5.
    assert report.retained == [5, 4, 3]


def test_orphans_survive_the_grace_period_then_go(repo: CheckpointRepository) -> None:
    _commit(repo, 1, 0)
    # A writer that crashed before its manifest: files of generation 2 without a manifest.
    orphan = repo.write_file(2, 0, "base", 0, rows([(b"x", b"y", 1)]))
    policy = RetentionPolicy(1, timedelta(0), timedelta(hours=1))
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    report = collect_garbage(repo, policy, now=now)
    assert orphan.path in _on_disk(repo)
    assert report.orphans == []
    report = collect_garbage(repo, policy, now=now + timedelta(hours=2))
    assert report.orphans == [orphan.path]
    assert orphan.path not in _on_disk(repo)


def test_a_corrupt_manifest_is_not_the_newest_usable(repo: CheckpointRepository) -> None:
    _commit(repo, 1, 0)
    _commit(repo, 2, 10)
    repo.store.write(repo.key(layout.manifest_key(3)), b"{truncated")
    report = collect_garbage(
        repo, RetentionPolicy(1, timedelta(0), timedelta(0)), now=T0 + timedelta(hours=1)
    )
    # Newest by count (3, unreadable) and newest usable (2) survive; 1 goes.
    assert report.retained == [3, 2]
    assert repo.verify(2).ok


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    created=st.lists(st.integers(0, 1000), min_size=1, max_size=7),
    policy=_policies,
    now_offset=st.integers(0, 2000),
    data=st.data(),
)
def test_collect_garbage_never_breaks_a_retained_checkpoint(
    tmp_path_factory: pytest.TempPathFactory,
    created: list[int],
    policy: RetentionPolicy,
    now_offset: int,
    data: st.DataObject,
) -> None:
    """Whatever the policy and clock: the survivors are the rule's, every retained checkpoint
    still verifies, and no data file is left that no retained manifest references."""
    repo = CheckpointRepository(FileBlobStore(tmp_path_factory.mktemp("gc")), "c_t")
    first = _commit(repo, 1, created[0])
    for gen, secs in enumerate(created[1:], start=2):
        reuse = {1: first.partitions[1].files[0]} if data.draw(st.booleans()) else None
        _commit(repo, gen, secs, reuse=reuse)
    now = T0 + timedelta(seconds=now_offset)
    ages = [CheckpointAge(g, T0 + timedelta(seconds=s), True) for g, s in enumerate(created, 1)]
    report = collect_garbage(repo, policy, now=now)
    assert set(report.retained) == retained_generations(ages, policy, now)
    assert set(repo.generations()) == set(report.retained)
    referenced = {f.path for g in repo.generations() for f in repo.read_manifest(g).files}
    assert {f for f in _on_disk(repo) if f.startswith("data/")} == referenced
    assert all(repo.verify(g).ok for g in repo.generations())
