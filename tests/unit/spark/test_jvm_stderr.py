"""The JVM's stderr forwarder (statesnap.spark.jvm_stderr), through a real pipe: start-up notices
dropped, a PySpark worker's traceback of its socket to the JVM closing dropped (whole, cut short,
or chained), every other line and traceback passed on as written."""

from __future__ import annotations

import os
import threading

from statesnap.spark.jvm_stderr import _forward

RUNNER = b"/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark"
CLOSED_SOCKET = (
    b"Traceback (most recent call last):\n"
    b'  File "' + RUNNER + b'/sql/streaming/python_streaming_source_runner.py", line 265, in main\n'
    b'  File "' + RUNNER + b'/serializers.py", line 604, in read_int\n'
    b"    raise EOFError\n"
    b"EOFError\n"
    b"\n"
    b"During handling of the above exception, another exception occurred:\n"
    b"\n"
    b"Traceback (most recent call last):\n"
    b'  File "' + RUNNER + b'/worker_util.py", line 253, in get_sock_file_to_executor\n'
    b"    yield sock_file\n"
    b"BrokenPipeError: [Errno 32] Broken pipe\n"
)
OURS = (
    b"Traceback (most recent call last):\n"
    b'  File "/venv/lib/python3.11/site-packages/statesnap/spark/source.py", line 10, in read\n'
    b"    raise ValueError('bad')\n"
    b"ValueError: bad\n"
)


def forwarded(*chunks: bytes) -> bytes:
    """What the forwarder writes for *chunks* written to its pipe in turn, the pipe then closed."""
    source_r, source_w = os.pipe()
    target_r, target_w = os.pipe()
    thread = threading.Thread(target=_forward, args=(source_r, target_w))
    thread.start()
    for chunk in chunks:
        os.write(source_w, chunk)
    os.close(source_w)
    thread.join(10)
    assert not thread.is_alive()
    os.close(target_w)
    with os.fdopen(target_r, "rb") as out:
        return out.read()


def test_lines_pass_and_notices_do_not() -> None:
    assert (
        forwarded(b"WARNING: Using incubator modules: jdk.incubator.vector\n", b"batch 1\n") == b"batch 1\n"
    )
    assert forwarded(b"\rstarting 3s", b"\rstarted\n") == b"\rstarting 3s\rstarted\n"


def test_a_workers_closed_socket_traceback_is_dropped_whole_or_cut_short() -> None:
    assert forwarded(b"before\n", CLOSED_SOCKET, b"after\n") == b"before\nafter\n"
    cut = CLOSED_SOCKET[: CLOSED_SOCKET.index(b"    yield")]  # the worker killed mid-print
    assert forwarded(b"before\n", cut) == b"before\n"
    assert forwarded(*[CLOSED_SOCKET[i : i + 7] for i in range(0, len(CLOSED_SOCKET), 7)]) == b""


def test_other_tracebacks_pass_whole() -> None:
    assert forwarded(OURS) == OURS
    assert forwarded(CLOSED_SOCKET, OURS) == OURS
    other = CLOSED_SOCKET.replace(b"BrokenPipeError: [Errno 32] Broken pipe", b"ValueError: no")
    assert forwarded(other).endswith(
        b"Traceback (most recent call last):\n" + other.split(b"Traceback (most recent call last):\n")[2]
    )
    cut = OURS[: OURS.index(b"    raise")]
    assert forwarded(cut) == cut
