"""A static member of a consumer group that test_rebalance_kills.py runs in a child process and
SIGKILLs: the tumbling count with final window results of ``processor_child.py`` (``final``) or
the outer join of ``join_child.py`` (``join``), both exactly once, as a group member.

Those scripts take no group id (the final count) or no group at all (the join), and they are
not this test's to change, so this one builds their processors (the same functions, so the
same windows, stores and checkpoint settings) and makes each a member of *GROUP* with
``group.instance.id`` *INSTANCE*. A static member keeps its ``transactional.id`` across
restarts: a restart fences what its killed incarnation left open at once (a dynamic member's
would hold ``read_committed`` readers, and the partitions' next owner, for
``transaction.timeout.ms``). Its partitions move when the group evicts it (the session timeout,
6 s) or when it rejoins: both are rebalances.

Run as ``python rebalance_child.py final BOOTSTRAP URL GROUP INSTANCE INPUT OUTPUT`` or
``python rebalance_child.py join BOOTSTRAP URL GROUP INSTANCE LEFT RIGHT OUTPUT`` with
``tests`` on ``PYTHONPATH``. It prints ``started <generation>`` once its first assignment is
restored and caught up, logs the group's assignments and revocations (INFO, stderr), processes
until SIGKILLed, and on SIGTERM closes cleanly (a final commit point and checkpoint) and prints
``closed``. It marks each hand-over (a rebalance taking partitions from it) and widens it
(:func:`widen_the_hand_over`), as ``processor_child.py`` widens a checkpoint's mid-write window,
so a kill the test aims at a hand-over lands inside it under any machine load.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from faults import join_child
from faults.processor_child import build_final, tally_options
from statesnap import CheckpointOptions, Processor, RetentionPolicy
from statesnap.processor.transactions import TransactionalOutputs
from statesnap.task.group import GroupMembership

__all__ = ["member"]


def member(kind: str, bootstrap: str, url: str, group: str, instance: str, topics: list[str]) -> Processor:
    """The *kind* processor (``final`` or ``join``) over *topics* (inputs, then the output) as the
    static member *instance* of *group*, exactly once, checkpointing at every commit point."""
    static = {"group.instance.id": instance}
    if kind == "final":
        topic, output = topics
        proc = build_final(bootstrap, topic, output, tally_options(url), exactly_once=True)
    elif kind == "join":
        left, right, output = topics
        every_commit = CheckpointOptions(  # join_child.py's
            url,
            interval=0,
            commit_interval="20ms",
            retention=RetentionPolicy(min_count=3, min_age=timedelta(0)),
        )
        proc = join_child.build(bootstrap, left, right, output, every_commit, exactly_once=True)
    else:
        raise SystemExit(f"unknown kind {kind!r}: final or join")
    return proc.replace(group=group, kafka_config=static)


#: How long a hand-over's transaction stays open before its commit, and committed before its
#: checkpoint (see :func:`widen_the_hand_over`).
HAND_OVER_DELAY = 0.25


def widen_the_hand_over() -> None:
    """Say where a hand-over is and widen its two windows (in this child process only): print
    ``handing over <partitions>`` as it begins, hold its transaction open
    :data:`HAND_OVER_DELAY` before the commit, print ``hand-over committed`` after it and wait
    as long again before the checkpoint. A hand-over otherwise takes a millisecond or two (the
    commit, then a report to the snapshot in progress), too short for a kill from outside to
    land in it."""
    leaving = GroupMembership.partitions_leaving
    commit = TransactionalOutputs.commit
    handing_over: list[bool] = []

    def said(membership: GroupMembership, partitions: list[int]) -> None:
        print("handing over", partitions, flush=True)
        handing_over.append(True)
        try:
            leaving(membership, partitions)
        finally:
            handing_over.clear()

    def slow_commit(outputs: TransactionalOutputs, *args: Any, **kwargs: Any) -> None:
        if not handing_over:
            commit(outputs, *args, **kwargs)
            return
        time.sleep(HAND_OVER_DELAY)
        commit(outputs, *args, **kwargs)
        print("hand-over committed", flush=True)
        time.sleep(HAND_OVER_DELAY)

    GroupMembership.partitions_leaving = said  # type: ignore[method-assign,assignment]
    TransactionalOutputs.commit = slow_commit  # type: ignore[method-assign,assignment]


def main() -> None:
    kind, bootstrap, url, group, instance, *topics = sys.argv[1:]
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {instance} %(name)s %(levelname)s %(message)s",
    )
    widen_the_hand_over()
    proc = member(kind, bootstrap, url, group, instance, topics)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    report = proc.start()
    print("started", report.checkpoint, flush=True)
    while not stop.wait(0.2):  # SIGKILLed by the test, or SIGTERM
        pass
    proc.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
