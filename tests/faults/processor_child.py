"""The processor test_processor_kills.py runs in a child process and SIGKILLs: a running tally.

Input records: key = account, value = an amount as ASCII digits, or null (the account is closed).
Two key-value stores, raw bytes (no serde, so a test can recompute the stored bytes without
statesnap): ``balances`` (the balance as ASCII digits) and ``payments`` (the number of payments,
8 bytes big-endian); every record emits ``(account, balance)`` or ``(account, null)`` to the output
topic. Checkpoints at every commit point (interval 0, a 20 ms commit interval), so a kill lands
in processing or in a checkpoint write, whichever is under way.

The windowed processor (``windows``): a tumbling count and a hopping sum over event time with
grace and retention, and a punctuator on stream time counting its calls in a key-value store;
:func:`window_model` is the plain-loop model of what its stores must hold. It emits nothing.

Run as ``python processor_child.py BOOTSTRAP TOPIC OUTPUT URL follow|once STORE [group=ID]
[windows|final] [exactly_once]``: ``follow`` prints ``started <generation>`` after the restore
and processes until killed; ``once`` restores, catches up, checkpoints and exits 0; ``group=ID``
makes it a member of that consumer group, ``windows`` runs the windowed processor, ``final`` the
tumbling count that emits final window results (:func:`build_final`), ``exactly_once`` makes the
outputs transactional. Blob-store credentials come from the
environment (never argv).

The child widens one window: it publishes each manifest :data:`MANIFEST_DELAY` after its data files
(:func:`widen_the_mid_write_window`), so the test's listing, polled every millisecond, sees "data
files, no manifest" and kills there under any machine load (a small delta's write otherwise leaves
that state for well under a millisecond, and a loaded CI machine once missed it in 30 s of polls).
"""

from __future__ import annotations

import struct
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from statesnap import (
    CheckpointOptions,
    ProcessingOptions,
    Processor,
    ProcessorContext,
    Record,
    RetentionPolicy,
    SnapshotOptions,
    StoreOptions,
    Windows,
)
from statesnap.checkpoint.manifest import CheckpointManifest
from statesnap.checkpoint.repository import CheckpointRepository

__all__ = [
    "EXACTLY_ONCE",
    "HOPPING",
    "NAME",
    "SNAPSHOT_TIMEOUT",
    "STORES",
    "TICK_MS",
    "TUMBLING",
    "WINDOWED",
    "Event",
    "build",
    "build_windowed",
    "tally_options",
    "window_model",
]

NAME = "tally"
STORES = ("balances", "payments")
#: Seconds until a killed writer's snapshot in progress reads as FAILED.
SNAPSHOT_TIMEOUT = 3.0
WINDOWED = "windows"
FINAL = "final"
EXACTLY_ONCE = "exactly_once"
TUMBLING = Windows.tumbling("1s", grace="300ms", retention="3s")
HOPPING = Windows.hopping("2s", advance="1s", grace="0s", retention="4s")
#: The punctuator's period (event time): it counts its calls per partition in store ``ticks``.
TICK_MS = 1500


def tally_options(
    url: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    interval: str | float = 0,
    generation: int | None = None,
    keep: int = 3,
    task_id: str | None = None,
) -> CheckpointOptions:
    """Checkpoint at every commit point (by default); GC keeps *keep* checkpoints; a killed
    writer's snapshot fails in :data:`SNAPSHOT_TIMEOUT` seconds (GC may then collect it).
    *task_id*: a task of its own in the table's snapshots (default: the writer's, ``main``)."""
    return CheckpointOptions(
        url,
        storage_options=storage_options,
        interval=interval,
        commit_interval="20ms",
        retention=RetentionPolicy(min_count=keep, min_age=timedelta(0)),
        snapshots=SnapshotOptions(timeout=SNAPSHOT_TIMEOUT, task_id=task_id),
        generation=generation,
    )


def build(
    bootstrap: str,
    topic: str,
    output: str,
    checkpoints: CheckpointOptions | None,
    store: str = "auto",
    group: str | None = None,
    *,
    exactly_once: bool = False,
) -> Processor:
    """The tally processor (the test builds the same one in-process to restore it); *store* is
    the local store kind holding both stores; with *group*, a member of that consumer group;
    *exactly_once* puts its outputs in transactions."""
    proc = Processor(
        NAME,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=checkpoints,
        stores=STORES,
        store=StoreOptions(store),
        group=group,
        processing=ProcessingOptions(exactly_once=exactly_once),
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


def build_windowed(
    bootstrap: str, topic: str, checkpoints: CheckpointOptions | None, store: str = "auto"
) -> Processor:
    """The windowed processor: input values ``{"amount": n}`` (JSON), keys as bytes."""
    proc = Processor(
        WINDOWED,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=checkpoints,
        value_serde="json",
        store=StoreOptions(store),
        timeout=20.0,
    )
    proc.count("counts", window=TUMBLING)
    proc.sum("sums", "amount", window=HOPPING)
    proc.add_store("ticks")

    @proc.punctuate(TICK_MS / 1000)
    def tick(ctx: ProcessorContext) -> None:
        ticks = ctx.stores["ticks"]
        ticks[b"n"] = ticks.get(b"n", 0) + 1

    return proc


def build_final(
    bootstrap: str, topic: str, output: str, checkpoints: CheckpointOptions | None, *, exactly_once: bool
) -> Processor:
    """A tumbling count per key that emits each window's final result to *output* (JSON
    ``{"start", "end", "value"}``, the input's key) when stream time closes it."""
    proc = Processor(
        FINAL,
        inputs=[topic],
        bootstrap_servers=bootstrap,
        checkpoints=checkpoints,
        value_serde="json",
        processing=ProcessingOptions(exactly_once=exactly_once),
        timeout=20.0,
    )
    proc.count("counts", window=TUMBLING, emit="final", to=output)
    return proc


@dataclass(frozen=True)
class Event:
    """An input record of the windowed processor, as the model sees it."""

    partition: int
    key: bytes
    timestamp: int
    amount: int


def window_model(records: Sequence[Event]) -> dict[bytes, bytes]:
    """Every stored key and value (all stores and the stream time per partition) the windowed
    processor's checkpoint must hold after *records* (each partition's in offset order), by the
    rules of the issue: a record counts in a window while stream time is below its end + grace;
    a window is gone at start + retention; the punctuator runs once per record whose stream time
    crosses a multiple of its period. Keys in the layout of processor/keyspace.py."""
    stream: dict[int, int] = {}
    ticks: dict[int, int] = {}
    counts: dict[tuple[int, int, bytes], int] = {}
    sums: dict[tuple[int, int, bytes], int] = {}
    for e in records:
        before = stream.get(e.partition, -1)
        now = stream[e.partition] = max(before, e.timestamp)
        for windows, into, add in ((TUMBLING, counts, 1), (HOPPING, sums, e.amount)):
            first = (e.timestamp - windows.size_ms) // windows.advance_ms + 1
            for k in range(first, e.timestamp // windows.advance_ms + 1):
                start = k * windows.advance_ms
                if now < start + windows.size_ms + windows.grace_ms:  # still open
                    into[(e.partition, start, e.key)] = into.get((e.partition, start, e.key), 0) + add
        if before >= 0 and now // TICK_MS > before // TICK_MS:  # once per crossing, after the record
            ticks[e.partition] = ticks.get(e.partition, 0) + 1
    out: dict[bytes, bytes] = {}
    for store, windows, values in (("counts", TUMBLING, counts), ("sums", HOPPING, sums)):
        for (p, start, key), value in values.items():
            if stream[p] >= start + windows.retention_ms:
                continue  # past retention: absent from the checkpoint
            stored = store.encode() + b"\x00" + struct.pack(">I", p) + struct.pack(">Q", start + (1 << 63))
            out[stored + key] = str(value).encode()
    for p, n in ticks.items():
        out[b"ticks\x00" + struct.pack(">I", p) + b"n"] = str(n).encode()
    for p, now in stream.items():
        out[b"_statesnap\x00" + struct.pack(">I", p) + b"stream_time"] = struct.pack(">q", now)
    return out


#: How long after its data files a checkpoint's manifest is published (see the module docstring).
MANIFEST_DELAY = 0.05


def widen_the_mid_write_window() -> None:
    """Publish every manifest :data:`MANIFEST_DELAY` late (in this child process only)."""
    publish = CheckpointRepository.commit

    def late_commit(repo: CheckpointRepository, manifest: CheckpointManifest) -> None:
        time.sleep(MANIFEST_DELAY)
        publish(repo, manifest)

    CheckpointRepository.commit = late_commit  # type: ignore[method-assign,assignment]


def main() -> None:
    widen_the_mid_write_window()
    bootstrap, topic, output, url, how, store = sys.argv[1:7]
    flags = sys.argv[7:]
    group = next((f.partition("=")[2] for f in flags if f.startswith("group=")), None)
    exactly_once = EXACTLY_ONCE in flags
    if FINAL in flags:
        proc = build_final(bootstrap, topic, output, tally_options(url), exactly_once=exactly_once)
    elif WINDOWED in flags:
        proc = build_windowed(bootstrap, topic, tally_options(url), store)
    else:
        proc = build(bootstrap, topic, output, tally_options(url), store, group, exactly_once=exactly_once)
    if how == "once":
        proc.run(follow=False)
        print("done", proc.last_checkpoint and proc.last_checkpoint.generation, flush=True)
        return
    said: list[bool] = []

    def restored(_records: int, _done: int, _total: int) -> None:
        # Said once the restore is done, at the catch-up's first progress report: a processor
        # checkpoints while it catches up, so a kill may land before the catch-up ends.
        if not said:
            said.append(True)
            print("started", proc.task.report.checkpoint, flush=True)

    report = proc.start(progress=restored)
    if not said:
        print("started", report.checkpoint, flush=True)
    while True:  # killed by the test
        time.sleep(1)


if __name__ == "__main__":
    main()
