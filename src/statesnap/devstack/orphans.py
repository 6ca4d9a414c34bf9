"""Dev services die with the process that started them, even when it is SIGKILLed.

``stop()`` and ``atexit`` cover a normal exit, but a test run killed by a timeout (or a demo
killed with ``kill -9``) runs neither: its broker, moto server and Spark daemons lived on,
orphaned, holding ports and memory. On Linux a child can ask the kernel for a signal when its
parent dies (``prctl(PR_SET_PDEATHSIG)``), and the request survives ``exec``. A guard — a bare
interpreter (``-S``: no site-packages, ~20 ms) — asks for it and then execs the service, so the
service's pid is the one ``Popen`` returned. Doing this in a ``preexec_fn`` instead would run
Python between fork and exec of a multi-threaded parent (librdkafka's threads), which can
deadlock.

The signal comes when the *thread* that started the service ends: start services from the main
thread or from one that lives as long as they should. Elsewhere than Linux the guard only execs.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

__all__ = ["guarded"]

_GUARD = """
import ctypes, os, sys
parent, sig = int(sys.argv[1]), int(sys.argv[2])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:  # the parent died before the request took effect
    sys.exit(0)
os.execvp(sys.argv[3], sys.argv[3:])
"""


def guarded(command: Sequence[str], sig: int = signal.SIGKILL) -> list[str]:
    """*command* run so that it receives *sig* when this process dies: SIGKILL for services that
    keep nothing worth flushing, SIGTERM for JVMs whose shutdown hooks stop their children."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-S", "-c", _GUARD, str(os.getpid()), str(int(sig)), *command]
