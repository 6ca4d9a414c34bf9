"""The Spark recipes of docs/reading-checkpoints.md, run verbatim on the shared ``local[2]`` session.

Each block is picked out with ``docsite.blocks.by_test`` (the doc marks it ``<!-- docs-test: by … NAME -->``).
Same checkpoint and ground truth as tests/integration/test_reading_recipes.py (a Python ``Table``
with base + two deltas with tombstones per partition and a pinned older checkpoint; truth = a
replay of the acknowledged records). Also proves the files' ``timestamp`` is UTC-adjusted:
``spark.read.parquet`` infers ``TimestampType``, not ``TimestampNTZType``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from integration.test_reading_recipes import Truth, Written, python_recipes, recipe, write_checkpoints

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def written(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> Written:
    w = write_checkpoints(kafka, tmp_path_factory.mktemp("recipes-spark"))
    assert all([f.kind for f in w.newest.partitions[p].files] == ["base", "delta", "delta"] for p in (0, 1))
    return w


def _truth(df: Any) -> Truth:
    rows = df.select("key", "value", "partition", "offset").collect()
    out = {bytes(r.key): (bytes(r.value), r.partition, r.offset) for r in rows}
    assert len(out) == len(rows), "a key appears twice"
    return out


def test_spark_sql_recipe_reads_the_table_with_utc_timestamps(
    spark: Any, written: Written, tmp_path: Path
) -> None:
    from pyspark.sql.types import TimestampNTZType, TimestampType

    files = [f"{written.table_dir}/{f.path}" for f in written.newest.files]
    assert spark.read.parquet(*files).schema["timestamp"].dataType == TimestampType()
    # what the files gave before (isAdjustedToUTC=false), so the check above can tell them apart
    local = pq.read_table(files[0])
    local = local.set_column(3, "timestamp", local["timestamp"].cast(pa.timestamp("ms")))
    pq.write_table(local, tmp_path / "local.parquet")
    assert (
        spark.read.parquet(str(tmp_path / "local.parquet")).schema["timestamp"].dataType == TimestampNTZType()
    )
    # the newest checkpoint (the generation argument is the shared file list's, tested without
    # Spark in test_reading_recipes.py); one job, to keep the test short
    df = python_recipes("spark")["read_checkpoint_spark"](spark, written.table_dir)
    assert df.schema["timestamp"].dataType == TimestampType()
    rows = df.selectExpr("key", "value", "partition", "offset", "unix_millis(timestamp) AS ms").collect()
    got = {bytes(r.key): (bytes(r.value), r.partition, r.offset) for r in rows}
    assert len(got) == len(rows), "a key appears twice"
    assert got == written.truth(written.newest)
    # each row's instant is the one its file holds (no time-zone shift on the way)
    in_files: dict[tuple[int, int], int] = {}
    for p, part in written.newest.partitions.items():
        for f in part.files:
            t = pq.read_table(Path(written.table_dir, f.path))
            ms = t["timestamp"].cast(pa.int64()).to_pylist()
            in_files.update(((p, off), m) for off, m in zip(t["offset"].to_pylist(), ms, strict=True))
    assert {(r.partition, r.offset): r.ms for r in rows} == {
        (r.partition, r.offset): in_files[r.partition, r.offset] for r in rows
    }


def test_read_table_one_liner_reads_the_table(spark: Any, written: Written) -> None:
    namespace = {
        "spark": spark,
        "checkpoints": written.root,
        "table": written.topic,
        "generation": written.pinned.generation,
    }
    exec(compile(recipe("read-table"), "reading-checkpoints.md[read-table]", "exec"), namespace)
    # the newest is read back in test_bootstrap.py; collecting one DataFrame keeps this test short
    assert namespace["table_df"].columns == ["key", "value", "offset", "timestamp", "partition"]
    assert _truth(namespace["older_df"]) == written.truth(written.pinned)
