"""Point in time on the real broker: ``Follower(..., checkpoints=CheckpointOptions(url,
generation=G), tail=False)`` and ``statesnap dump --generation G --no-tail`` give the table
exactly as snapshot G holds it; conflicting flags are refused in one line; a missing generation
is named; a checkpoint URL holding nothing is said out loud (issue 11) instead of silently
replaying everything.

Ground truth is independent of statesnap: the table a KTable must hold (last write wins, a
tombstone deletes) computed from the records the broker acknowledged in the batches produced
before each checkpoint (tests/integration/conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from statesnap import CheckpointOptions, Follower, Table
from statesnap.cli import cli
from statesnap.digest import table_digest
from statesnap.errors import (
    ConfigError,
    GenerationNotFoundError,
    NoUsableCheckpointError,
    ReadOnlyTableError,
    SnapshotNotFoundError,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3


def batch(rng: random.Random, n: int, tag: str) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    for i in range(n):
        key = b"k%03d" % rng.randrange(60)
        value = None if rng.random() < 0.15 else f"{tag}-{i}".encode()
        out.append((key[-1] % PARTITIONS, key, value))
    return out


def tree_hash(root: Path) -> str:
    """Names and bytes of every file under *root*: equal hashes, nothing written."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def three_generations(kafka: Any, tmp_path: Path) -> dict[str, Any]:
    """A topic with checkpoints 1, 2, 3, each after one more batch, then a tail no checkpoint has."""
    rng = random.Random(7)
    topic = kafka.create_topic(f"pit-{uuid.uuid4().hex[:12]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    owner = Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False)
    owner.start()
    produced: list[Any] = []
    truths: dict[int, dict[bytes, bytes]] = {}
    try:
        for gen in (1, 2, 3):
            produced += kafka.produce(topic, batch(rng, 150, f"g{gen}"))
            ends = kafka.end_offsets(produced, range(PARTITIONS))
            kafka.drain(owner, ends)
            manifest = owner.checkpoint()
            assert manifest is not None
            assert manifest.generation == gen
            assert manifest.offsets == ends
            truths[gen] = kafka.truth(produced)
    finally:
        owner.close(checkpoint=False)
    produced += kafka.produce(topic, batch(rng, 100, "tail"))
    return {
        "topic": topic,
        "url": url,
        "root": tmp_path / "cp",
        "truths": truths,
        "full": kafka.truth(produced),
    }


def test_table_at_a_generation_without_tail_is_that_snapshot(
    kafka: Any, three_generations: dict[str, Any]
) -> None:
    g = three_generations
    assert len({json.dumps(sorted(t.items()), default=repr) for t in g["truths"].values()}) == 3
    before = tree_hash(g["root"])
    for gen, truth in g["truths"].items():
        t = Follower(
            g["topic"],
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(g["url"], generation=gen),
            tail=False,
        )
        report = t.start()
        try:
            assert report.checkpoint == gen
            assert report.replayed_records == 0
            assert dict(t.raw_items()) == truth
            assert t.offsets == t.last_checkpoint.offsets  # type: ignore[union-attr]
            assert not t.caught_up
            assert t.wait_for(dict.fromkeys(range(PARTITIONS), 0), timeout=5)  # below the cut: at once
            assert not t.wait_for({0: 10_000}, timeout=5)  # never moves: answers at once
            with pytest.raises(ReadOnlyTableError, match="point-in-time"):
                t.checkpoint()
        finally:
            t.close()
    assert tree_hash(g["root"]) == before, "a point-in-time read wrote to the checkpoint store"

    # With the tail (the default) every generation converges on the full replay.
    for gen in (1, 3):
        with Follower(
            g["topic"],
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(g["url"], generation=gen),
        ) as t:
            assert dict(t.raw_items()) == g["full"]


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_dump_no_tail_digests_differ_per_generation(kafka: Any, three_generations: dict[str, Any]) -> None:
    g = three_generations
    base = ["dump", "-b", kafka.bootstrap, "-t", g["topic"], "-c", g["url"], "--digest", "--json", "-q"]
    expected_full = table_digest(g["full"].items())
    no_tail, with_tail = {}, {}
    for gen, truth in g["truths"].items():
        r = run_cli(*base, "--generation", str(gen), "--no-tail")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert (doc["digest"], doc["keys"]) == table_digest(truth.items())
        assert doc["checkpoint"] == gen
        assert doc["replayed_records"] == 0
        assert doc["tail"] is False
        no_tail[gen] = doc["digest"]
        r = run_cli(*base, "--generation", str(gen))
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert (doc["digest"], doc["keys"]) == expected_full
        with_tail[gen] = doc["digest"]
    assert len(set(no_tail.values())) == 3
    assert len(set(with_tail.values())) == 1


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--no-checkpoint", "--generation", "1"], ["--generation", "--no-checkpoint"]),
        (["--no-tail"], ["--no-tail", "--generation"]),
        (["--no-checkpoint", "--no-tail"], ["--no-tail", "--generation"]),
    ],
)
def test_dump_refuses_conflicting_flags_in_one_line(
    kafka: Any, tmp_path: Path, flags: list[str], names: list[str]
) -> None:
    r = run_cli("dump", "-b", kafka.bootstrap, "-t", "whatever", "-c", tmp_path.as_uri(), *flags)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.stderr
    for name in names:
        assert name in errors[0]
    assert "Traceback" not in r.output
    assert list(tmp_path.iterdir()) == []
    r = run_cli("dump", "-b", kafka.bootstrap, "-t", "whatever", "--generation", "1")
    assert r.exit_code == 2
    assert "--checkpoints" in r.stderr


def test_a_missing_generation_is_named(kafka: Any, three_generations: dict[str, Any]) -> None:
    g = three_generations
    for tail in (True, False):
        t = Follower(
            g["topic"],
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(g["url"], generation=99),
            tail=tail,
        )
        with pytest.raises(GenerationNotFoundError, match=r"no generation 99 .*generations there: 1, 2, 3"):
            t.start()
        t.close()
    # One class for both ways of looking at it.
    assert issubclass(GenerationNotFoundError, NoUsableCheckpointError)
    assert issubclass(GenerationNotFoundError, SnapshotNotFoundError)
    r = run_cli(
        "dump", "-b", kafka.bootstrap, "-t", g["topic"], "-c", g["url"], "--generation", "99", "--no-tail"
    )
    assert r.exit_code == 1
    assert "GenerationNotFoundError: no generation 99" in r.stderr
    assert "Traceback" not in r.output


def test_point_in_time_arguments_are_checked_before_any_io() -> None:
    with pytest.raises(ConfigError, match="tail=False needs generation"):
        Follower("t", bootstrap_servers="127.0.0.1:1", checkpoints="/tmp/x", tail=False)
    with pytest.raises(ConfigError, match="tail=False needs generation"):
        Follower("t", bootstrap_servers="127.0.0.1:1", checkpoints=None, tail=False)
    with pytest.raises(ConfigError, match=">= 1"):
        Table("t", bootstrap_servers="127.0.0.1:1", checkpoints=CheckpointOptions("/tmp/x", generation=0))


def test_a_checkpoint_url_holding_nothing_is_a_warning_not_silence(
    kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11: a typo'd checkpoint URL made a follower replay the whole topic in silence."""
    topic = kafka.create_topic(f"typo-{uuid.uuid4().hex[:12]}", 2)
    produced = kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"2")])
    right = (tmp_path / "checkpoints").as_uri()
    with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=right, background=False) as owner:
        pass  # the close writes generation 1
    assert owner.repo is not None
    assert owner.repo.generations() == [1]

    typo = (tmp_path / "checkpionts").as_uri()
    caplog.set_level(logging.INFO, logger="statesnap")
    with Follower(topic, bootstrap_servers=kafka.bootstrap, checkpoints=typo) as f:
        assert dict(f.raw_items()) == kafka.truth(produced)
        assert f.report.checkpoint is None
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "no checkpoint found" in r.message
    ]
    assert len(warnings) == 1, caplog.text
    assert "checkpionts" in warnings[0].message
    assert "replaying the whole topic" in warnings[0].message

    caplog.clear()
    strict = Follower(
        topic, bootstrap_servers=kafka.bootstrap, checkpoints=CheckpointOptions(typo, require=True)
    )
    with pytest.raises(NoUsableCheckpointError, match="checkpionts"):
        strict.start()
    assert strict.state == "failed"

    caplog.clear()
    r = run_cli("dump", "-b", kafka.bootstrap, "-t", topic, "-c", typo, "--digest", "-q")
    assert r.exit_code == 0, r.output
    # (pytest's log capture owns the root logger here, so the CLI's stderr handler is not installed)
    assert any(r.levelno == logging.WARNING and "no checkpoint found" in r.message for r in caplog.records)
    r = run_cli("dump", "-b", kafka.bootstrap, "-t", topic, "-c", typo, "--require-checkpoint")
    assert r.exit_code == 1
    assert "NoUsableCheckpointError" in r.stderr
    assert "Traceback" not in r.output

    caplog.set_level(logging.INFO, logger="statesnap")  # the CLI set its own level
    caplog.clear()  # the right URL: a checkpoint is used and nothing is said
    with Follower(topic, bootstrap_servers=kafka.bootstrap, checkpoints=right) as f:
        assert f.report.checkpoint == 1
    assert not [r for r in caplog.records if "no checkpoint found" in r.message]

    caplog.clear()  # an owner's very first start is not worth a warning
    fresh = (tmp_path / "fresh").as_uri()
    with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=fresh, background=False):
        pass
    found = [r for r in caplog.records if "no checkpoint found" in r.message]
    assert [r.levelno for r in found] == [logging.INFO]
