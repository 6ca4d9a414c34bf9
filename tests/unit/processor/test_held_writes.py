"""Per-record handlers' writes held across batches (statesnap.processor.buffer, the write-back
cache a Python task turns on): the same state, skips, dead letters and outputs as writes handed
to the store at every batch's end, for readers outside the handlers at any moment too, and in
the store once a commit point or a partition's release comes. Over a real store, no broker."""

from __future__ import annotations

import random
from typing import Any

import pytest

from statesnap import JoinWindows, ProcessingOptions, Processor, Windows
from statesnap.processor import StoreSpec
from statesnap.processor.buffer import HELD_KEYS, RETRY_AFTER
from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.handler import ProcessorHandler
from statesnap.processor.keyspace import partition_prefix
from statesnap.processor.stores import StoreReader
from statesnap.serde import resolve_serde
from statesnap.stores import StateStore, open_state_store
from unit.processor_fakes import Message, Recorded

T0 = 1_700_000_000_000
PARTITIONS = (0, 1, 2)


def batches(seed: int, *, n: int, keys: int) -> list[tuple[int, list[Message]]]:
    """Batches of three partitions, interleaved: additions, deletes (amount 0), records without
    key, and values the handler cannot add (dead letters)."""
    rng = random.Random(seed)
    offsets = dict.fromkeys(PARTITIONS, 0)
    out: list[tuple[int, list[Message]]] = []
    ts = T0
    while n > 0:
        p = rng.choice(PARTITIONS)
        batch = []
        for _ in range(min(n, rng.randrange(1, 60))):
            ts += rng.randrange(0, 300)
            key: bytes | None = b"k%d" % rng.randrange(keys) if rng.random() > 0.03 else None
            roll = rng.random()
            value = b'{"amount": "x"}' if roll < 0.02 else b'{"amount": %d}' % int(roll * 10)
            batch.append(Message(key, value, offsets[p], ts))
            offsets[p] += 1
        n -= len(batch)
        out.append((p, batch))
    return out


def tally(record: Record, ctx: ProcessorContext) -> None:
    """Adds the amount to the key's total (0 deletes it), emits the change; a str amount raises
    after the write: a dead letter whose write must not stay."""
    if record.key is None:
        ctx.skip()
        return
    totals = ctx.stores["t"]
    amount = record.value["amount"]
    if amount == 0:
        totals.pop(record.key, None)
        return
    totals[record.key] = totals.get(record.key, 0) + 1
    totals[record.key] = total = totals[record.key] - 1 + amount + 0  # a str amount raises here
    ctx.emit("out", record.key, total)


def processor() -> Processor:
    proc = Processor(
        "p",
        inputs=["events"],
        bootstrap_servers="localhost:1",
        stores=["t"],
        value_serde="json",
        processing=ProcessingOptions(dead_letter_topic="dead"),
    )
    proc.handler(tally)
    return proc


def reader(handler: ProcessorHandler, proc: Processor, store: StateStore, *, held: bool) -> StoreReader:
    reads: Any = handler.reads() if held else store
    return StoreReader(StoreSpec("t"), proc.key_serde, resolve_serde("json"), reads, PARTITIONS)


def rows_of(store: StateStore) -> dict[int, list[tuple[Any, ...]]]:
    columns = ("key", "value", "offset", "timestamp")
    return {
        p: sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True))
        for p, t in store.export().items()
    }


def run(*, hold: int | None, seed: int = 3) -> dict[str, Any]:
    """The history through one handler; *hold*: writes held (that many keys at most)."""
    proc = processor()
    store = open_state_store("memory")
    outputs = Recorded(proc)
    handler = proc.handler_for(store, outputs)
    if hold is not None:
        assert handler.hold_writes()
        handler.buffer.hold = hold
    seen = []
    for i, (p, batch) in enumerate(batches(seed, n=3000, keys=40)):
        handler.apply(p, batch, None)
        if i % 7 == 0:  # what a reader outside the handlers sees, between batches
            seen.append(dict(reader(handler, proc, store, held=hold is not None).items()))
    before_commit = rows_of(store)
    handler.commit_point(checkpoint=True)
    return {
        "before_commit": before_commit,
        "rows": rows_of(store),
        "seen": seen,
        "skipped": handler.skipped,
        "dead": handler.dead_lettered,
        "sent": outputs.sent,
        "stream_times": [handler.stream_time(p) for p in PARTITIONS],
    }


@pytest.mark.parametrize("hold", [HELD_KEYS, 25])
def test_held_writes_leave_what_writes_at_every_batch_end_leave(hold: int) -> None:
    plain = run(hold=None)
    held = run(hold=hold)
    assert held["rows"] == plain["rows"]
    assert held["seen"] == plain["seen"]
    for what in ("skipped", "dead", "sent", "stream_times"):
        assert held[what] == plain[what], what
    assert plain["dead"] > 0
    assert plain["skipped"] > 0
    assert len(plain["seen"]) > 10
    # Held means held: with the default hold nothing reaches the store before the commit
    # point; a hold of 25 keys hands them all over whenever more are held.
    if hold == HELD_KEYS:
        assert held["before_commit"] == {}
    else:
        assert held["before_commit"] != {}


def test_a_held_delete_hides_the_stored_row_from_readers() -> None:
    proc = processor()
    store = open_state_store("memory")
    handler = proc.handler_for(store, Recorded(proc))
    assert handler.hold_writes()
    handler.apply(0, [Message(b"a", b'{"amount": 2}', 0, T0), Message(b"b", b'{"amount": 3}', 1, T0)], None)
    handler.commit_point(checkpoint=False)  # a and b in the store
    handler.apply(0, [Message(b"a", b'{"amount": 0}', 2, T0), Message(b"c", b'{"amount": 4}', 3, T0)], None)
    held = reader(handler, proc, store, held=True)
    assert dict(held.items()) == {b"b": 3, b"c": 4}
    assert held.get(b"a") is None
    assert held[b"c"] == 4
    assert dict(reader(handler, proc, store, held=False).items()) == {b"a": 2, b"b": 3}  # not yet


def test_a_released_partition_reaches_the_store_before_its_rows_go() -> None:
    proc = processor()
    store = open_state_store("memory")
    handler = proc.handler_for(store, Recorded(proc))
    assert handler.hold_writes()
    handler.apply(1, [Message(b"a", b'{"amount": 2}', 0, T0)], None)
    handler.apply(2, [Message(b"b", b'{"amount": 5}', 0, T0)], None)
    assert len(store) == 0
    handler.release([1])
    assert len(store) == 4  # both partitions' rows and stream times
    assert store.drop_partitions([1]) > 0


@pytest.mark.parametrize(
    ("stores", "declare", "held"),
    [
        pytest.param(
            [], lambda proc: proc.count("c", window=Windows.tumbling("1m")), True, id="a window fold"
        ),
        pytest.param([StoreSpec("t", ttl="1h")], lambda proc: proc.handler(tally), False, id="a TTL store"),
        pytest.param(
            [],
            lambda proc: proc.join("j", left="events", right="more", window=JoinWindows.of("1m"), to="out"),
            False,
            id="a join's buffers",
        ),
        pytest.param(
            [StoreSpec("t"), StoreSpec("w", window=Windows.tumbling("1m"))],
            lambda proc: proc.handler(tally),
            True,
            id="a window store beside",
        ),
    ],
)
def test_writes_are_held_except_beside_a_ttl_store_or_a_join(
    stores: list[StoreSpec], declare: Any, held: bool
) -> None:
    """A TTL store's sweep scans the store itself, and a join's buffers (window stores that never
    expire) have no index to find held writes in a range scan by; a window store's expiry goes
    through the buffer, which forgets what it holds of the expired windows."""
    proc = Processor("p", inputs=["events", "more"], bootstrap_servers="localhost:1", stores=stores)
    declare(proc)
    handler = proc.handler_for(open_state_store("memory"), Recorded(proc))
    assert handler.hold_writes() is held
    assert handler.buffer.hold == (HELD_KEYS if held else 0)


WINDOW = Windows.tumbling("20s")


@pytest.mark.parametrize("hold", [HELD_KEYS, 25])
@pytest.mark.parametrize(
    "declare",
    [
        pytest.param(lambda proc: proc.count("c", window=WINDOW), id="count"),
        pytest.param(lambda proc: proc.count("c", window=Windows.tumbling("20s", grace="30s")), id="grace"),
        pytest.param(lambda proc: proc.sum("c", "amount", window=WINDOW), id="sum"),
        pytest.param(lambda proc: proc.count("c", window=WINDOW, emit="final", to="out"), id="final"),
    ],
)
def test_held_window_writes_land_as_writes_at_every_batch_end(hold: int, declare: Any) -> None:
    """Window aggregations with their writes held (counts held decoded, windows that expire
    before a hand-over dropped from what is held, final results read back from what is held)
    leave, show readers between batches and emit what writing every batch's end does."""

    def run_windows(*, held: int | None) -> dict[str, Any]:
        proc = Processor(
            "p",
            inputs=["events"],
            bootstrap_servers="localhost:1",
            value_serde="json",
            processing=ProcessingOptions(dead_letter_topic="dead"),
        )
        declare(proc)
        store = open_state_store("memory")
        outputs = Recorded(proc)
        handler = proc.handler_for(store, outputs)
        if held is not None:
            assert handler.hold_writes()
            handler.buffer.hold = held
        spec = proc.stores["c"]
        ks, vs = proc.key_serde, resolve_serde("json")
        seen = []
        for i, (p, batch) in enumerate(batches(17, n=4000, keys=40)):
            handler.apply(p, batch, None)
            if i % 5 == 0:
                reads: Any = handler.reads() if held is not None else store
                seen.append(dict(StoreReader(spec, ks, vs, reads, PARTITIONS).items()))
        if held == HELD_KEYS:
            assert len(store) == 0  # nothing reached the store before the commit point
        handler.commit_point(checkpoint=True)
        return {
            "seen": seen,
            "rows": rows_of(store),
            "skipped": handler.skipped,
            "dead": handler.dead_lettered,
            "sent": outputs.sent,
        }

    plain, held = run_windows(held=None), run_windows(held=hold)
    assert held == plain
    assert plain["rows"]
    assert any(plain["seen"])


def test_holding_stops_where_keys_are_seldom_written_twice_and_is_tried_again_later() -> None:
    """Millions of keys each touched once in a while: held writes are a second large dictionary
    that saves nothing. Once *hold* keys fill up before the records reach twice that, writes go
    to the store at each batch's end again; a commit point tries holding anew once RETRY_AFTER
    times the hold in records went by."""
    proc = processor()
    store = open_state_store("memory")
    handler = proc.handler_for(store, Recorded(proc))
    assert handler.hold_writes()
    handler.buffer.hold = 10

    def batch(first: int, n: int, key: str = "k%d") -> list[Message]:
        return [Message((key % i).encode(), b'{"amount": 1}', first + i, T0) for i in range(n)]

    handler.apply(0, batch(0, 8), None)
    assert len(store) == 0  # 8 keys (and the stream time): held
    handler.apply(0, batch(8, 8, "j%d"), None)  # 17 keys held after 16 records: holding stops
    assert len(store) == 17
    assert not handler.buffer.holding
    handler.apply(0, batch(16, 3, "m%d"), None)
    assert len(store) == 20  # written at the batch's end
    handler.commit_point(checkpoint=False)  # too soon to try again
    handler.apply(0, batch(19, RETRY_AFTER * 10 - 3, "n%d"), None)
    assert len(store) == 20 + RETRY_AFTER * 10 - 3  # still written at once
    handler.commit_point(checkpoint=False)  # RETRY_AFTER times the hold went by: held again
    assert handler.buffer.holding
    first = 19 + RETRY_AFTER * 10 - 3
    handler.apply(0, batch(first, 3, "o%d"), None)
    assert len(store) == 20 + RETRY_AFTER * 10 - 3  # held
    # Keys written again and again: when the hold fills up, everything is handed over and
    # writes are held again.
    handler.commit_point(checkpoint=False)
    n, start = len(store), first + 3
    for at in range(start, start + 50, 10):
        again = [Message(b"k%d" % (i % 5), b'{"amount": 1}', at + i, T0) for i in range(10)]
        handler.apply(0, again, None)
    assert len(store) == n  # 5 keys held (and the stream time)
    handler.apply(0, batch(start + 50, 6, "p%d"), None)  # 12 keys held after 56 records: handed over
    assert len(store) == n + 6
    handler.apply(0, batch(start + 56, 2, "q%d"), None)
    assert len(store) == n + 6  # held again
    handler.commit_point(checkpoint=False)
    assert dict(reader(handler, proc, store, held=False).items())[b"k0"] == 1 + 10


@pytest.mark.parametrize("hold", [HELD_KEYS, 25])
def test_a_count_held_decoded_reads_and_lands_as_the_per_record_count(hold: int) -> None:
    """A count folded per batch holds its aggregates decoded: readers between batches, the
    store after the commit point and batches it cannot fold at once (records without key, the
    per-record path's) all see what counting each record into the store gives."""

    def run_count(*, held: int | None) -> tuple[list[dict[Any, Any]], dict[int, list[tuple[Any, ...]]], int]:
        proc = Processor("p", inputs=["events"], bootstrap_servers="localhost:1", value_serde="json")
        proc.count("c")
        store = open_state_store("memory")
        handler = proc.handler_for(store, Recorded(proc))
        if held is None:
            handler._batched = None  # the per-record path: every record read and written
        else:
            assert handler.hold_writes()
            handler.buffer.hold = held
        spec, ks, vs = StoreSpec("c"), proc.key_serde, resolve_serde("json")
        seen = []
        for i, (p, batch) in enumerate(batches(11, n=3000, keys=40)):
            handler.apply(p, batch, None)
            if i % 5 == 0:
                reads: Any = handler.reads() if held is not None else store
                seen.append(dict(StoreReader(spec, ks, vs, reads, PARTITIONS).items()))
        if held == HELD_KEYS:
            assert len(store) == 0  # nothing reached the store before the commit point
        handler.commit_point(checkpoint=True)
        return seen, rows_of(store), handler.skipped

    assert run_count(held=hold) == run_count(held=None)


@pytest.mark.parametrize("big", [2**63 - 2, 2**70], ids=["at int64's end", "beyond int64"])
def test_a_held_count_the_store_holds_near_or_beyond_int64_stays_exact(big: int) -> None:
    """Held counts live in int64 columns; a count the store holds near int64's end (where
    adding would overflow) or beyond it turns its group's column into Python integers."""
    proc = Processor("p", inputs=["events"], bootstrap_servers="localhost:1", value_serde="json")
    proc.count("c")
    store = open_state_store("memory")
    store.apply(0, [(partition_prefix("c", 0) + b"k1", b"%d" % big, 0, T0)])
    handler = proc.handler_for(store, Recorded(proc))
    assert handler.hold_writes()
    batch = [
        Message(b"k1", b"{}", 1, T0 + 1),
        Message(b"k2", b"{}", 2, T0 + 2),
        Message(b"k1", b"{}", 3, T0 + 3),
    ]
    handler.apply(0, batch, None)
    spec, ks, vs = StoreSpec("c"), proc.key_serde, resolve_serde("json")
    assert dict(StoreReader(spec, ks, vs, handler.reads(), (0,)).items()) == {b"k1": big + 2, b"k2": 1}
    handler.commit_point(checkpoint=True)
    assert dict(StoreReader(spec, ks, vs, store, (0,)).items()) == {b"k1": big + 2, b"k2": 1}
    offsets = {key: offset for key, _value, offset, _ts in rows_of(store)[0]}
    assert offsets[partition_prefix("c", 0) + b"k1"] == 3  # its last record's


def test_a_window_handler_s_range_scans_see_held_writes_and_deletes() -> None:
    """A handler that writes and deletes windows and reads them back by ``fetch_all`` (the range
    scan that finds held writes through the window index) sees and leaves, writes held, what it
    sees and leaves with writes at every batch's end."""
    spec = StoreSpec("w", window=Windows.tumbling("20s", grace="40s"))

    def handle(record: Record, ctx: ProcessorContext) -> None:
        if record.key is None:
            return
        windows = ctx.window_stores["w"]
        start = record.timestamp // 20_000 * 20_000
        if record.value["amount"] == 0:
            windows.delete(record.key, start)
        else:
            windows.put(record.key, start, (windows.get(record.key, start) or 0) + 1)
        seen = windows.fetch_all(start - 40_000, start)
        ctx.emit("out", record.key, [[k, s, v] for k, s, v in seen][-3:])

    def run_handler(*, held: int | None) -> dict[str, Any]:
        proc = Processor(
            "p",
            inputs=["events"],
            bootstrap_servers="localhost:1",
            stores=[spec],
            value_serde="json",
            processing=ProcessingOptions(dead_letter_topic="dead"),
        )
        proc.handler(handle)
        store = open_state_store("memory")
        outputs = Recorded(proc)
        handler = proc.handler_for(store, outputs)
        if held is not None:
            assert handler.hold_writes()
            handler.buffer.hold = held
        for p, batch in batches(23, n=3000, keys=30):
            handler.apply(p, batch, None)
        handler.commit_point(checkpoint=True)
        return {"rows": rows_of(store), "sent": outputs.sent, "dead": handler.dead_lettered}

    plain = run_handler(held=None)
    assert plain["rows"]
    assert plain["sent"]
    assert run_handler(held=HELD_KEYS) == plain
    assert run_handler(held=25) == plain
