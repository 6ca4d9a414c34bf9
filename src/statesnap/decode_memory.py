"""The memory pool checkpoint files are decoded into, and handing its free pages back.

Why not Arrow's default pool (mimalloc in pyarrow's wheels): decoding Parquet frees many
short-lived buffers (decompressed pages, value buffers that grew by doubling), and mimalloc keeps
those pages resident, even after ``release_unused()``. jemalloc's pool hands them back. Restoring
10 M keys (1,058 MiB of keys and values, 1,288 MiB of Arrow arrays, 8 partitions, a 2-core machine;
16 restores alternating in fresh processes): peak RSS 1,756 MiB into mimalloc, 1,621 into jemalloc;
ready in 0.70 s at best but 1.63 s median (up to 3.55 s) into mimalloc, 1.04 s best and 1.12 s
median (at most 1.33 s) into jemalloc, which pays for fresh pages but never for mimalloc's slow
runs. Where pyarrow was built without jemalloc (Windows), files decode into the default pool.
"""

from __future__ import annotations

import functools

import pyarrow as pa

__all__ = ["decode_pool", "release_unused"]


@functools.cache
def decode_pool() -> pa.MemoryPool:
    """jemalloc's pool where pyarrow has it, else the default pool (see the module docstring)."""
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


def release_unused() -> None:
    """Give the pages the pools hold free back to the OS: after a restore's decoding, before the
    key index is built (so the restore's peak is about its final size). The system pool's release
    trims the C heap (``malloc_trim`` on glibc), which also holds the downloaded files' freed bytes."""
    pools = {id(p): p for p in (pa.default_memory_pool(), decode_pool(), pa.system_memory_pool())}
    for pool in pools.values():
        pool.release_unused()
