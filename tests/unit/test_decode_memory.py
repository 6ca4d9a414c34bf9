"""Checkpoint files decode into their own pool (jemalloc where pyarrow has it, issue 21: a restore's
peak memory), and what they decode reads the same as pyarrow's own reader gives."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from statesnap.checkpoint import datafile
from statesnap.decode_memory import decode_pool, release_unused


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([b"k%06d" % i for i in range(n)], pa.binary()),
            "value": pa.array([b"v" * (i % 50) for i in range(n)], pa.binary()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([i * 1000 for i in range(n)], pa.int64()).cast(
                pa.timestamp("ms", tz="UTC")
            ),
        }
    ).cast(datafile.SCHEMA)


def test_decoded_files_live_in_the_decode_pool_and_equal_pyarrows_reading() -> None:
    encoded = datafile.encode(_rows(50_000))
    pool = decode_pool()
    before = pool.bytes_allocated()
    table = datafile.decode(encoded.data, expected_sha256=encoded.sha256)
    assert pool.bytes_allocated() - before >= table.nbytes * 0.9  # its buffers, not the default pool's
    assert table.equals(pq.read_table(pa.BufferReader(encoded.data)).cast(datafile.SCHEMA))
    del table
    release_unused()
    assert pool.bytes_allocated() <= before


def test_the_decode_pool_is_jemalloc_where_pyarrow_has_it() -> None:
    expected = (
        "jemalloc" if "jemalloc" in pa.supported_memory_backends() else pa.default_memory_pool().backend_name
    )
    assert decode_pool().backend_name == expected


def test_a_default_pool_chosen_with_arrows_own_variable_is_the_decode_pool_too() -> None:
    code = "from statesnap.decode_memory import decode_pool; print(decode_pool().backend_name)"
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "system"
