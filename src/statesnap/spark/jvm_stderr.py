"""The JVM's own start-up notices, kept out of the terminal.

Spark's launcher always adds ``--add-modules=jdk.incubator.vector``, and the JVM then prints
"WARNING: Using incubator modules: jdk.incubator.vector" to its stderr — before log4j exists, so
no logging setting removes it. The JVM inherits this process's stderr, so while it is started the
descriptor is swapped for a pipe; a thread forwards what the JVM (and its Python workers) write,
minus these notices, for as long as they live. Whatever cannot be the start of a notice goes on
at once, not at the next newline: this process's own progress display (carriage returns, cursor
moves, no newline) shares the descriptor while the session starts.

PySpark's Python workers also write here, and when a streaming query stops (Ctrl-C, SIGTERM) the
JVM closes a worker's socket under it: the worker may print a traceback of its own socket closing
(``EOFError`` in ``read_int``, then the flush of the closed socket), or start one and be killed
half-way. Such a traceback says nothing a user can act on (the stop was theirs; the command
reports its own outcome), so a traceback whose every frame is PySpark's and whose exception is the
connection closing is dropped; any other traceback, a statesnap frame in it, goes on whole.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["NOTICES", "without_jvm_notices"]

#: Lines the JVM prints at start-up that say nothing a statesnap user can act on.
NOTICES = (b"WARNING: Using incubator modules:",)


#: How a Python traceback begins.
_TRACEBACK = b"Traceback (most recent call last):"


def _must_wait(partial: bytes) -> bool:
    """Whether an unfinished line could still turn out to be a notice or the start of a traceback
    (so it waits for its end)."""
    return any(held.startswith(partial[: len(held)]) for held in (*NOTICES, _TRACEBACK))


#: The line between a traceback and the one raised while handling it.
_CHAINED = (
    b"During handling of the above exception, another exception occurred:",
    b"The above exception was the direct cause of the following exception:",
)
#: A worker's connection to the JVM closing: what the last line of its traceback then names.
_CLOSED = (b"EOFError", b"BrokenPipeError", b"ConnectionResetError", b"ConnectionAbortedError")


class _Tracebacks:
    """Holds a traceback's lines until its exception line, then keeps or drops it whole
    (:data:`_CLOSED` from PySpark frames only is dropped, with the chaining lines after it)."""

    def __init__(self) -> None:
        self.held: list[bytes] | None = None
        self.after_dropped = False

    @property
    def holding(self) -> bool:
        """Whether an unfinished line must wait for its end (a traceback's, or a chaining line's)."""
        return self.held is not None or self.after_dropped

    def line(self, line: bytes) -> bytes:
        """What to write for one complete *line* (without its newline)."""
        if self.held is None:
            if line == _TRACEBACK:
                self.held, self.after_dropped = [line], False
                return b""
            if self.after_dropped and (not line.strip() or line in _CHAINED):
                return b""
            self.after_dropped = False
            return line + b"\n"
        self.held.append(line)
        if not line or line[:1].isspace():
            return b""
        return self.end()  # the exception line

    def end(self) -> bytes:
        """The traceback held (complete, or cut short by the end of the output) is decided."""
        held, self.held = self.held or [], None
        frames = [line for line in held if line.lstrip().startswith(b'File "')]
        last = held[-1] if len(held) > 1 and not held[-1][:1].isspace() else None
        if all(b"/pyspark/" in f for f in frames) and (last is None or last.startswith(_CLOSED)):
            self.after_dropped = True
            return b""
        return b"".join(line + b"\n" for line in held)


def _forward(source: int, target: int) -> None:
    tracebacks = _Tracebacks()
    with os.fdopen(source, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(tracebacks.line(line) for line in lines if not line.startswith(NOTICES))
            if pending and not tracebacks.holding and not _must_wait(pending):
                kept, pending = kept + pending, b""
            if kept:
                os.write(target, kept)
        tail = b""
        if pending and not pending.startswith(NOTICES):
            tail = tracebacks.line(pending) if tracebacks.holding else pending
        if tracebacks.held is not None:
            tail += tracebacks.end()
        if tail:
            os.write(target, tail)


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
