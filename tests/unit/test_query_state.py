"""Spark streaming state vs statesnap's offsets, on a directory laid out as Spark lays out its
checkpoint location (``offsets/<batch>``: "v1", metadata, one JSON line per source;
``commits/<batch>``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from statesnap.spark.query_state import MARKER, committed_offsets, disagreement, reconcile_query_state

ME = {"table_url": "file:///ckpt/c_t", "cluster_id": "c", "topic": "t"}


def spark_state(path: Path, batches: dict[int, dict[str, int]], committed: int | None) -> None:
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    for batch, offsets in batches.items():
        (path / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offsets)}\n')
    if committed is not None:
        (path / "commits" / str(committed)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_committed_offsets_are_the_last_committed_batch(tmp_path: Path) -> None:
    spark_state(tmp_path, {0: {"0": 5}, 1: {"0": 9}}, committed=0)
    assert committed_offsets(tmp_path, "t") == {0: 5}  # batch 1 was planned, not committed
    assert committed_offsets(tmp_path / "nothing", "t") is None


def test_committed_offsets_read_spark_style_per_topic_json(tmp_path: Path) -> None:
    spark_state(tmp_path, {3: {"t": {"0": 7, "1": 2}}}, committed=3)  # type: ignore[dict-item]
    assert committed_offsets(tmp_path, "t") == {0: 7, 1: 2}


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
