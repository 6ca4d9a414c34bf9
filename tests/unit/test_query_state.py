"""Spark streaming state vs statesnap's offsets, on a directory laid out as Spark lays out its
checkpoint location (``offsets/<batch>``: "v1", metadata, one JSON line per source;
``commits/<batch>``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from statesnap.spark.query_state import MARKER, disagreement, reconcile_query_state, spark_offsets

ME = {"table_url": "file:///ckpt/c_t", "cluster_id": "c", "topic": "t"}


def spark_state(path: Path, batches: dict[int, dict[str, int]], committed: int | None) -> None:
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    for batch, offsets in batches.items():
        (path / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offsets)}\n')
    if committed is not None:
        (path / "commits" / str(committed)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_spark_offsets_are_the_last_committed_batch(tmp_path: Path) -> None:
    spark_state(tmp_path, {0: {"0": 5}, 1: {"0": 9}}, committed=0)
    assert spark_offsets(tmp_path, "t") == {0: 5}  # batch 1 was planned, not committed
    assert spark_offsets(tmp_path / "nothing", "t") is None


def test_before_the_first_commit_spark_offsets_are_the_batch_it_would_re_run(tmp_path: Path) -> None:
    """A query stopped after statesnap's checkpoint of batch 0 but before Spark committed it: a
    restart re-runs batch 0 as planned, so its offsets are what Spark resumes from (once missed:
    the topic and store were then recreated, the state was kept and the re-run failed)."""
    spark_state(tmp_path, {0: {"0": 306}}, committed=None)
    assert spark_offsets(tmp_path, "t") == {0: 306}
    moved = reconcile_query_state(str(tmp_path), topic="t", offsets={0: 0}, identity=ME)
    assert moved is not None, "state that would re-run a batch past statesnap's offsets was kept"


def test_spark_offsets_read_spark_style_per_topic_json(tmp_path: Path) -> None:
    spark_state(tmp_path, {3: {"t": {"0": 7, "1": 2}}}, committed=3)  # type: ignore[dict-item]
    assert spark_offsets(tmp_path, "t") == {0: 7, 1: 2}


@pytest.mark.parametrize(
    ("spark", "ours", "marker", "bad"),
    [
        (None, {0: 0}, None, False),  # a fresh location
        ({0: 5}, {0: 5}, ME, False),  # in step
        ({0: 3}, {0: 5}, ME, False),  # behind: a re-run reads nothing, harmless
        ({0: 9}, {0: 5}, ME, True),  # ahead: store wiped or topic recreated
        ({0: 5}, {0: 5}, {**ME, "cluster_id": "other"}, True),  # another cluster's state
    ],
)
def test_disagreement(
    spark: dict[int, int] | None, ours: dict[int, int], marker: dict[str, str] | None, bad: bool
) -> None:
    assert (disagreement(spark, ours, marker, ME) is not None) is bad


def test_reconcile_moves_stale_state_aside_and_marks_the_location(tmp_path: Path) -> None:
    loc = tmp_path / "chk"
    spark_state(loc, {4: {"0": 100}}, committed=4)
    moved = reconcile_query_state(str(loc), topic="t", offsets={0: 10}, identity=ME)
    assert moved is not None
    assert Path(moved).exists()  # renamed, never deleted
    assert (Path(moved) / "offsets" / "4").exists()
    assert json.loads((loc / MARKER).read_text()) == ME
    assert not (loc / "offsets").exists()
    # in step now: kept as it is
    assert reconcile_query_state(str(loc), topic="t", offsets={0: 10}, identity=ME) is None
