"""Retention GC as a table runs it: after every checkpoint, on file:// and s3:// alike."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from statesnap import CheckpointOptions, RetentionPolicy, Table
from statesnap.checkpoint import CheckpointRepository, collect_garbage

pytestmark = pytest.mark.integration


def _referenced(repo: CheckpointRepository) -> set[str]:
    return {f.path for g in repo.generations() for f in repo.read_manifest(g).files}


def _data_files(repo: CheckpointRepository) -> set[str]:
    n = len(repo.directory) + 1
    return {b.key[n:] for b in repo.store.list(repo.directory + "/data/")}


def test_gc_after_each_checkpoint_keeps_min_count(checkpoint_location: Any, kafka: Any) -> None:
    topic = kafka.create_topic(f"gc-{uuid.uuid4().hex[:12]}", 3)
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            checkpoint_location.url,
            storage_options=checkpoint_location.options,
            interval="1h",
            commit_interval="1h",
            retention=RetentionPolicy(min_count=2, min_age=timedelta(0), orphan_grace=timedelta(0)),
        ),
    )
    t.start()
    produced: list[Any] = []
    gens: list[int] = []
    try:
        for i in range(5):
            # Only partition i % 3 changes: later checkpoints reference files of earlier ones.
            produced += kafka.produce(topic, [(i % 3, b"k%d-%d" % (i % 3, j), b"v%d" % i) for j in range(5)])
            kafka.drain(t, kafka.end_offsets(produced, range(3)))
            m = t.checkpoint()
            assert m is not None
            gens.append(m.generation)
            repo = t.repo
            assert repo is not None
            assert repo.generations() == sorted(gens, reverse=True)[:2]
            # Nothing a retained checkpoint needs is gone; nothing else is left.
            assert _data_files(repo) == _referenced(repo)
            for g in repo.generations():
                assert repo.verify(g).ok
    finally:
        t.close(checkpoint=False)

    assert repo is not None  # narrowed in the loop above; the checker forgets it past the finally
    for generation in repo.generations():
        r = Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            background=False,
            checkpoints=CheckpointOptions(
                checkpoint_location.url, storage_options=checkpoint_location.options, generation=generation
            ),
        )
        report = r.start()
        try:
            assert report.checkpoint == generation
            assert dict(r.raw_items()) == kafka.truth(produced)
        finally:
            r.close(checkpoint=False)


def test_min_age_keeps_young_checkpoints(checkpoint_location: Any, kafka: Any) -> None:
    topic = kafka.create_topic(f"gcage-{uuid.uuid4().hex[:12]}", 1)
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        checkpoints=CheckpointOptions(
            checkpoint_location.url,
            storage_options=checkpoint_location.options,
            retention=RetentionPolicy(min_count=1, min_age=timedelta(hours=1)),
        ),
    )
    t.start()
    produced: list[Any] = []
    try:
        for i in range(4):
            produced += kafka.produce(topic, [(0, b"k", b"%d" % i)])
            kafka.drain(t, kafka.end_offsets(produced, [0]))
            assert t.checkpoint() is not None
        repo = t.repo
        assert repo is not None
        assert len(repo.generations()) == 4  # all younger than an hour
        newest = repo.generations()[0]
        # An explicit GC on a clock two hours ahead keeps only min_count.
        from datetime import UTC, datetime

        report = collect_garbage(
            repo,
            RetentionPolicy(1, timedelta(hours=1), timedelta(hours=1)),
            now=datetime.now(UTC) + timedelta(hours=2),
        )
        assert report.retained == [newest]
        assert repo.generations() == [newest]
        assert _data_files(repo) == _referenced(repo)
    finally:
        t.close(checkpoint=False)
