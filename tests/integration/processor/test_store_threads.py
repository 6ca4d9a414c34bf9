"""A store, and an emit, belong to the handler call that uses them (issue 34, item 4): another thread
reading or writing a handler's store view (or emitting) while that call runs is refused with
:class:`StoreAccessError`, as one outside any call is. Before, the guard was per process: a write
from a thread the handler started was accepted and checkpointed under the record in hand. Proven on
the suite's broker
(Apache Kafka); nothing here depends on broker behaviour beyond delivering the records.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from integration.conftest import KafkaTool
from statesnap import CheckpointOptions, Processor, ProcessorContext, Record, StoreSpec, Windows
from statesnap.errors import StoreAccessError


def test_another_thread_during_a_handler_call_is_refused(
    kafka: KafkaTool, topic_name: str, tmp_path: Path
) -> None:
    """Every access of a handler's key-value and window views from a thread the handler started
    (and joined, so the call is running throughout) raises; the handler's own writes stand, and
    the checkpoint holds nothing the other thread tried to write."""
    topic = kafka.create_topic(topic_name, 2)
    kafka.produce(topic, [(i % 2, f"k{i}".encode(), json.dumps({"n": i}).encode()) for i in range(6)])
    url = str(tmp_path / "ckpt")
    proc = Processor(
        "threads",
        inputs=[topic],
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h"),
        stores=["seen", StoreSpec("per_minute", window=Windows.tumbling("1m"))],
        value_serde="json",
    )
    refused: list[tuple[str, BaseException | None]] = []

    def intrude(ctx: ProcessorContext, record: Record) -> None:
        seen, windows = ctx.stores["seen"], ctx.window_stores["per_minute"]
        start = record.timestamp // 60_000 * 60_000
        attempts: dict[str, Any] = {
            "kv write": lambda: seen.__setitem__(b"intruder", 1),
            "kv read": lambda: seen.get(record.key),
            "kv delete": lambda: seen.__delitem__(record.key),
            "kv iterate": lambda: list(seen),
            "window write": lambda: windows.put(b"intruder", start, 1),
            "window read": lambda: windows.get(record.key, start),
            "emit": lambda: ctx.emit(topic + "-out", b"intruder", 1),
        }
        for what, attempt in attempts.items():
            caught: list[BaseException | None] = [None]

            def run(attempt: Any = attempt, caught: list[BaseException | None] = caught) -> None:
                try:
                    attempt()
                except BaseException as e:  # the test reports whatever it was
                    caught[0] = e

            thread = threading.Thread(target=run)
            thread.start()
            thread.join(10)
            refused.append((what, caught[0]))

    @proc.handler
    def on_record(record: Record, ctx: ProcessorContext) -> None:
        ctx.stores["seen"][record.key] = record.value["n"]
        if record.offset == 0:
            intrude(ctx, record)

    proc.start()
    try:
        rows = dict(proc.store("seen").items())
        windows = dict(proc.store("per_minute").items())
    finally:
        proc.close()  # with a checkpoint
    assert len(refused) == 14  # seven attempts in each partition's first record
    for what, error in refused:
        assert isinstance(error, StoreAccessError), (what, error)
        assert "from another thread while" in str(error), (what, error)
    assert b"intruder" not in rows
    assert rows == {f"k{i}".encode(): i for i in range(6)}
    assert not windows

    restored = Processor(
        "threads",
        inputs=[topic],
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(url, interval="1h"),
        stores=["seen", StoreSpec("per_minute", window=Windows.tumbling("1m"))],
        value_serde="json",
    )
    restored.handler(lambda record, ctx: None)
    restored.start()
    try:
        assert dict(restored.store("seen").items()) == rows  # the checkpoint holds no intruder
    finally:
        restored.close(checkpoint=False)
