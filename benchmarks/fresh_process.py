"""Measuring in a fresh process: a benchmark script runs its ``child(args)`` again in a new
interpreter, so each measurement has its own peak RSS, its own allocator state and no warm caches.

The script re-runs itself with ``--child JSON``; the child prints its result as the last line of
stdout, as JSON. Used by scale.py, decode_pool.py, auto_store.py and rocksdb_state.py, with the RSS
readers below.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ChildFailedError", "parse_or_run_child", "peak_rss", "rss_now", "run_child"]


class ChildFailedError(RuntimeError):
    """A measurement's child process failed: the last line it wrote to stderr says why."""


def run_child(
    script: str, args: Mapping[str, Any], env: Mapping[str, str | None] | None = None
) -> dict[str, Any]:
    """*script*'s ``child(args)`` in a new interpreter, with *env* over this process's environment
    (None unsets a variable)."""
    environ = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    out = subprocess.run(
        [sys.executable, script, "--child", json.dumps(args)],
        check=False,
        capture_output=True,
        text=True,
        env=environ,
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ChildFailedError(f"{Path(script).name}'s child exited with {out.returncode}: {last}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def parse_or_run_child(
    ap: argparse.ArgumentParser, child: Callable[[dict[str, Any]], dict[str, Any]]
) -> argparse.Namespace | None:
    """The script's arguments; or, run as a child (``--child JSON``), None once ``child`` printed
    its result."""
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return None
    return args


def rss_now() -> int:
    """Current resident set size (bytes): the baseline a measurement's peak is taken from."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's RSS high-water mark. Not ``ru_maxrss``: Linux carries that over from the
    parent across fork + exec, so a child would report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
