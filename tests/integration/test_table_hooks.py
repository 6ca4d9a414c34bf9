"""Hooks on the real broker: ``on_update(key, old, new)``, ``on_checkpoint(manifest)`` and a
restore listener — what they receive, on which thread, and that a hook raising never stops the
table (statesnap/hooks.py documents the rules these tests hold it to).

Expected calls are derived from the records the broker acknowledged, by the KTable definition
(last write wins, a tombstone deletes), not from statesnap.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from statesnap import Hooks, RestoreListener, Table
from statesnap.checkpoint import CheckpointManifest

pytestmark = pytest.mark.integration


def expected_updates(
    before: dict[bytes, bytes], recs: list[tuple[int, bytes, bytes | None]]
) -> list[tuple[str, Any, Any]]:
    """(key, old, new) per record applied on top of *before*, decoded; no-op tombstones dropped."""
    state = dict(before)
    out = []
    for _p, key, value in recs:
        old = state.get(key)
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
        if old is not None or value is not None:
            out.append(
                (
                    key.decode(),
                    None if old is None else json.loads(old),
                    None if value is None else json.loads(value),
                )
            )
    return out


def j(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_on_update_gets_old_and_new_after_start_on_the_consuming_thread(
    kafka: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.create_topic(f"upd-{uuid.uuid4().hex[:12]}", 1)
    history = [(0, b"a", j(1)), (0, b"b", j(2)), (0, b"a", j(3))]
    produced = kafka.produce(topic, history)
    calls: list[tuple[str, Any, Any]] = []
    threads: set[str] = set()

    def on_update(key: str, old: Any, new: Any) -> None:
        threads.add(threading.current_thread().name)
        calls.append((key, old, new))
        if key == "boom":
            raise RuntimeError("hook bug")

    t: Table[str, Any] = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        key_serde="string",
        value_serde="json",
        hooks=Hooks(on_update=on_update),
    )
    caplog.set_level(logging.WARNING, logger="statesnap")
    t.start()
    try:
        assert calls == []  # the replay inside start() is a restore, not updates
        live = [
            (0, b"c", j({"x": 1})),  # insert
            (0, b"a", j(4)),  # update
            (0, b"b", None),  # delete
            (0, b"zz", None),  # tombstone of an absent key: no change, no call
            (0, b"boom", j(0)),  # the hook raises: logged, the table goes on
            (0, b"c", j({"x": 2})),
            (0, b"c", j({"x": 3})),  # twice more in one batch: old is the previous record's value
            (0, b"bad", b"not json"),  # undecodable: logged and skipped
            (0, b"d", j([1])),
        ]
        produced += kafka.produce(topic, live)
        last = produced[-1].offset
        assert t.wait_for({0: last}, timeout=20)
        kafka.wait_for(lambda: len(calls) >= 7, what="the hook calls")
        before = kafka.truth(produced[: len(history)])
        want = expected_updates(before, [r for r in live if r[1] != b"bad"])
        assert calls == want
        assert threads == {f"statesnap-{t.name}"}
        assert t.get("d") == [1]
        t.raise_if_failed()  # the raising hook did not stop the consumer
        assert "on_update hook raised" in caplog.text
        assert "hook bug" in caplog.text
        assert "on_update skipped for key b'bad'" in caplog.text
    finally:
        t.close(checkpoint=False)


def test_on_update_runs_on_the_polling_thread_without_background(kafka: Any) -> None:
    topic = kafka.create_topic(f"updp-{uuid.uuid4().hex[:12]}", 2)
    seen: list[tuple[str, bytes | None, bytes | None, str]] = []
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        background=False,
        key_serde="string",
        hooks=Hooks(on_update=lambda k, o, n: seen.append((k, o, n, threading.current_thread().name))),
    )
    t.start()
    try:
        produced = kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"2"), (0, b"a", b"3")])
        kafka.drain(t, kafka.end_offsets(produced, [0, 1]))
        me = threading.current_thread().name
        assert sorted(seen, key=repr) == sorted(
            [("a", None, b"1", me), ("a", b"1", b"3", me), ("b", None, b"2", me)], key=repr
        )
        assert [s for s in seen if s[0] == "a"] == [("a", None, b"1", me), ("a", b"1", b"3", me)]
    finally:
        t.close(checkpoint=False)


def test_on_checkpoint_receives_each_completed_manifest(
    kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = kafka.create_topic(f"ckh-{uuid.uuid4().hex[:12]}", 2)
    produced = kafka.produce(topic, [(0, b"a", b"1"), (1, b"b", b"2")])
    got: list[tuple[CheckpointManifest, str]] = []
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=(tmp_path / "cp").as_uri(),
        background=False,
        hooks=Hooks(on_checkpoint=lambda m: got.append((m, threading.current_thread().name))),
    )
    t.start()
    try:
        first = t.checkpoint()
        assert first is not None
        assert [(m.generation, m.offsets) for m, _ in got] == [(1, kafka.end_offsets(produced, [0, 1]))]
        assert got[0][1] == threading.current_thread().name
        assert t.checkpoint() is None  # nothing changed: no checkpoint, no call
        assert len(got) == 1

        produced += kafka.produce(topic, [(0, b"c", b"3")])
        kafka.drain(t, kafka.end_offsets(produced, [0, 1]))
        second = t.checkpoint()
        assert second is not None
        assert [(m.generation, m.offsets) for m, _ in got][1:] == [(2, kafka.end_offsets(produced, [0, 1]))]
        assert got[1][0] == second
    finally:
        t.close(checkpoint=False)

    def broken(manifest: CheckpointManifest) -> None:
        raise RuntimeError("on_checkpoint bug")

    caplog.set_level(logging.ERROR, logger="statesnap")
    produced += kafka.produce(topic, [(1, b"d", b"4")])
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=(tmp_path / "cp").as_uri(),
        background=False,
        hooks=Hooks(on_checkpoint=broken),
    )
    t.start()
    try:
        manifest = t.checkpoint()
        assert manifest is not None
        assert manifest.offsets == kafka.end_offsets(produced, [0, 1])
        assert "on_checkpoint hook raised" in caplog.text
        assert "on_checkpoint bug" in caplog.text
    finally:
        t.close(checkpoint=False)


class Recorder(RestoreListener):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.threads: set[str] = set()

    def on_restore_start(self, partition: int, start_offset: int) -> None:
        self.threads.add(threading.current_thread().name)
        self.events.append(("start", partition, start_offset))

    def on_batch_restored(self, partition: int, batch_end_offset: int, records: int) -> None:
        self.events.append(("batch", partition, batch_end_offset, records))
        if records < 0:  # never; keeps the signature honest
            raise AssertionError

    def on_restore_end(self, partition: int, total_records: int) -> None:
        self.events.append(("end", partition, total_records))
        raise RuntimeError("listener bug")  # logged, never fatal


def test_restore_listener_reports_each_partition(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(f"rl-{uuid.uuid4().hex[:12]}", 3)
    url = (tmp_path / "cp").as_uri()
    produced = kafka.produce(topic, [(p, b"k%d-%d" % (p, i), b"v") for p in range(3) for i in range(5)])
    with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False):
        pass  # checkpoint at 5/5/5
    tail = kafka.produce(topic, [(0, b"t%d" % i, b"v") for i in range(300)] + [(2, b"x", b"y")])
    produced += tail
    listener = Recorder()
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=url,
        background=False,
        hooks=Hooks(restore_listener=listener),
    )
    report = t.start()
    try:
        assert report.checkpoint == 1
        starts = [e for e in listener.events if e[0] == "start"]
        assert starts == [("start", 0, 5), ("start", 1, 5), ("start", 2, 5)]
        assert listener.events[:3] == starts  # before any batch
        ends = {e[1]: e[2] for e in listener.events if e[0] == "end"}
        assert ends == {0: 300, 1: 0, 2: 1}
        for p, total in ends.items():
            batches = [e for e in listener.events if e[0] == "batch" and e[1] == p]
            assert sum(b[3] for b in batches) == total
            ends_at = [b[2] for b in batches]
            assert ends_at == sorted(ends_at)
            if batches:
                assert ends_at[-1] == max(r.offset for r in produced if r.partition == p)
            end_index = listener.events.index(("end", p, total))
            assert all(listener.events.index(b) < end_index for b in batches)
        assert listener.threads == {threading.current_thread().name}
        assert dict(t.raw_items()) == kafka.truth(produced)
    finally:
        t.close(checkpoint=False)
