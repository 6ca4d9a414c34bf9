"""The processor test_join_kills.py runs in a child process and SIGKILLs: a windowed outer join.

Two co-partitioned inputs (``LEFT``, ``RIGHT``; JSON values ``{"id": N}``) joined within
:data:`WINDOW` (``how="outer"``: pairs, and each unmatched record once its window closes) into
``OUTPUT``, exactly once; checkpoints at every commit point (20 ms), as ``processor_child.py``'s. (A script of
its own: it imports nothing from the test package.)

Run as ``python join_child.py BOOTSTRAP LEFT RIGHT OUTPUT URL follow|once``: ``follow``
processes until killed, ``once`` restores, catches up, checkpoints and exits 0.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from statesnap import CheckpointOptions, JoinWindows, ProcessingOptions, Processor, RetentionPolicy
from statesnap.processor import transactions

__all__ = ["NAME", "WINDOW", "build"]

NAME = "joins"
WINDOW = JoinWindows.of("300ms", grace="200ms").before("600ms")


def build(
    bootstrap: str,
    left: str,
    right: str,
    output: str,
    checkpoints: CheckpointOptions | None,
    *,
    exactly_once: bool,
) -> Processor:
    proc = Processor(
        NAME, inputs=[left, right], bootstrap_servers=bootstrap, checkpoints=checkpoints, key_serde="string",
        value_serde="json", processing=ProcessingOptions(exactly_once=exactly_once), timeout=20.0,
    )  # fmt: skip
    proc.join("pairs", left=left, right=right, window=WINDOW, how="outer", to=output)
    return proc


def main() -> None:
    bootstrap, left, right, output, url, how = sys.argv[1:7]
    # During a catch-up no commit point runs: a transaction commits once it has been open
    # MAX_OPEN_SECONDS (10 s). A catch-up shorter than that committed once, at its end, and the
    # test's first kill (after the first commit) then came after it (a CI rehearsal). Half a
    # second puts several commits, and so the kills, inside the catch-up.
    transactions.MAX_OPEN_SECONDS = 0.5
    every_commit = CheckpointOptions(
        url, interval=0, commit_interval="20ms", retention=RetentionPolicy(min_count=3, min_age=timedelta(0))
    )
    proc = build(bootstrap, left, right, output, every_commit, exactly_once=True)
    proc.run(follow=how == "follow")
    print("done", flush=True)


if __name__ == "__main__":
    main()
