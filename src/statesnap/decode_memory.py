"""The memory pool checkpoint files are decoded into, and handing its free pages back.

Why not Arrow's default pool (mimalloc in pyarrow's wheels): decoding Parquet frees many
short-lived buffers (decompressed pages, value buffers that grew by doubling), and mimalloc keeps
those pages resident, even after ``release_unused()``; it also asks for transparent huge pages,
which a kernel whose THP ``defrag`` setting is ``madvise`` (a common default) finds by compacting
memory while the restore waits. jemalloc's pool hands freed pages back and asks for no huge pages.

``benchmarks/decode_pool.py`` restores 10 M keys (1,058 MiB of keys and values, 1,288 MiB of Arrow
arrays, 8 partitions) 8 times into each pool, alternating in fresh processes; on a 2-core machine
up for hours, THP ``enabled=madvise defrag=madvise``:

============  ==========================  ============  ==============  ================
pool          ready: best / median / max  peak RSS      ``get``/s       on huge pages
============  ==========================  ============  ==============  ================
mimalloc      0.73 / 1.78 / 3.40 s        1,764 MiB     405 k           1,583 MiB
jemalloc      1.03 / 1.19 / 1.36 s        1,638 MiB     392 k           126 MiB
============  ==========================  ============  ==============  ================

Lookups pay for the small pages (more TLB misses): 3 % there, up to a fifth in other runs of the
same day. Collapsing the restored buffers into huge pages afterwards (``MADV_COLLAPSE``) won 13 %
back for 3.7 CPU seconds, not worth it. A restore that never stalls for seconds is worth more: it
is what statesnap is for.
Where pyarrow was built without jemalloc (Windows), or where the user chose Arrow's default pool
with Arrow's own ``ARROW_DEFAULT_MEMORY_POOL`` (``mimalloc`` for the faster lookups above, say),
files decode into the default pool.
"""

from __future__ import annotations

import functools
import os

import pyarrow as pa

__all__ = ["decode_pool", "release_unused"]


@functools.cache
def decode_pool() -> pa.MemoryPool:
    """jemalloc's pool where pyarrow has it, else the default pool; the default pool also when
    ``ARROW_DEFAULT_MEMORY_POOL`` chose it (see the module docstring)."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool()
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


def release_unused() -> None:
    """Ask both pools to give the pages they hold free back to the OS: after a restore's decoding,
    before the key index is built (so the restore's peak is about its final size). pyarrow's
    jemalloc measured to give back nothing on request (26.0: 200 MiB freed, RSS unchanged); it
    hands them back by its own decay within a second or two, which is why it is the decode pool."""
    pa.default_memory_pool().release_unused()
    if decode_pool().backend_name != pa.default_memory_pool().backend_name:
        decode_pool().release_unused()
