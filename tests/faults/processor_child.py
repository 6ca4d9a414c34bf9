"""The processor test_processor_kills.py runs in a child process and SIGKILLs: a running tally.

Input records: key = account, value = an amount as ASCII digits, or null (the account is closed).
Two key-value stores, raw bytes (no serde, so a test can recompute the stored bytes without
statesnap): ``balances`` (the balance as ASCII digits) and ``payments`` (the number of payments,
8 bytes big-endian); every record emits ``(account, balance)`` or ``(account, null)`` to the output
topic. Checkpoints at every commit point (interval 0, a 20 ms commit interval), so a kill lands
in processing or in a checkpoint write, whichever is under way.

Run as ``python processor_child.py BOOTSTRAP TOPIC OUTPUT URL follow|once STORE [GROUP]``: ``follow`` prints
``started <generation>`` after the restore and processes until killed; ``once`` restores, catches
up, checkpoints and exits 0. Blob-store credentials come from the environment (never argv).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from datetime import timedelta

from statesnap import (
    CheckpointOptions,
    Processor,
    ProcessorContext,
    Record,
    RetentionPolicy,
    SnapshotOptions,
    StoreOptions,
)

__all__ = ["NAME", "SNAPSHOT_TIMEOUT", "STORES", "build", "tally_options"]

NAME = "tally"
STORES = ("balances", "payments")
#: Seconds until a killed writer's snapshot in progress reads as FAILED.
SNAPSHOT_TIMEOUT = 3.0


def tally_options(
    url: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    interval: str | float = 0,
    generation: int | None = None,
    keep: int = 3,
) -> CheckpointOptions:
    """Checkpoint at every commit point (by default); GC keeps *keep* checkpoints; a killed
    writer's snapshot fails in :data:`SNAPSHOT_TIMEOUT` seconds (GC may then collect it)."""
    return CheckpointOptions(
        url,
        storage_options=storage_options,
        interval=interval,
        commit_interval="20ms",
        retention=RetentionPolicy(min_count=keep, min_age=timedelta(0)),
        snapshots=SnapshotOptions(timeout=SNAPSHOT_TIMEOUT),
        generation=generation,
    )


def build(
    bootstrap: str,
    topic: str,
    output: str,
    checkpoints: CheckpointOptions | None,
    store: str = "auto",
    group: str | None = None,
) -> Processor:
    """The tally processor (the test builds the same one in-process to restore it); *store* is
    the local store kind holding both stores; with *group*, a member of that consumer group."""
    proc = Processor(
        NAME,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=checkpoints,
        stores=STORES,
        store=StoreOptions(store),
        group=group,
        timeout=20.0,
    )

    @proc.handler
    def on_payment(record: Record, ctx: ProcessorContext) -> None:
        balances, payments = ctx.stores["balances"], ctx.stores["payments"]
        if record.value is None:  # the account is closed: its state goes
            balances.pop(record.key, None)
            payments.pop(record.key, None)
            ctx.emit(output, record.key, None)
            return
        balance = int(balances.get(record.key, b"0")) + int(record.value)
        balances[record.key] = b"%d" % balance
        count = int.from_bytes(payments.get(record.key, bytes(8)), "big") + 1
        payments[record.key] = count.to_bytes(8, "big")
        ctx.emit(output, record.key, b"%d" % balance)

    return proc


def main() -> None:
    bootstrap, topic, output, url, how, store = sys.argv[1:7]
    group = sys.argv[7] if len(sys.argv) > 7 else None
    proc = build(bootstrap, topic, output, tally_options(url), store, group)
    if how == "once":
        proc.run(follow=False)
        print("done", proc.last_checkpoint and proc.last_checkpoint.generation, flush=True)
        return
    report = proc.start()
    print("started", report.checkpoint, flush=True)
    while True:  # killed by the test
        time.sleep(1)


if __name__ == "__main__":
    main()
