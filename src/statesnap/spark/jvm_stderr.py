"""The JVM's own start-up notices, kept out of the terminal.

Spark's launcher always adds ``--add-modules=jdk.incubator.vector``, and the JVM then prints
"WARNING: Using incubator modules: jdk.incubator.vector" to its stderr — before log4j exists, so
no logging setting removes it. The JVM inherits this process's stderr, so while it is started the
descriptor is swapped for a pipe; a thread forwards what the JVM (and its Python workers) write,
minus these notices, for as long as they live. Whatever cannot be the start of a notice goes on
at once, not at the next newline: this process's own progress display (carriage returns, cursor
moves, no newline) shares the descriptor while the session starts.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["NOTICES", "without_jvm_notices"]

#: Lines the JVM prints at start-up that say nothing a statesnap user can act on.
NOTICES = (b"WARNING: Using incubator modules:",)


def _may_become_notice(partial: bytes) -> bool:
    """Whether an unfinished line could still turn out to be a notice (so it must wait)."""
    return any(notice.startswith(partial[: len(notice)]) for notice in NOTICES)


def _forward(source: int, target: int) -> None:
    with os.fdopen(source, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not line.startswith(NOTICES))
            if pending and not _may_become_notice(pending):
                kept, pending = kept + pending, b""
            if kept:
                os.write(target, kept)
        if pending and not pending.startswith(NOTICES):
            os.write(target, pending)


@contextlib.contextmanager
def without_jvm_notices() -> Iterator[None]:
    """Child processes started inside get a filtered stderr; this process keeps its own."""
    try:
        original = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    forward = threading.Thread(
        target=_forward, args=(read_end, original), name="statesnap-jvm-stderr", daemon=True
    )
    forward.start()
    try:
        yield
    finally:
        os.dup2(original, 2)  # the pipe's last writers are now the children alone
