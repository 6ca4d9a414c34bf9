"""The per-record handler path (statesnap.processor.handler's ``_handle``) with nothing to replay
and with an exactly-once replay bound must leave the same state, skips, dead letters and outputs
for the same records: here the replay branch is forced by a bound of 0 (nothing below it, so
nothing is state-only), over a real store, no broker."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any, Literal

import pytest

from statesnap import ProcessingOptions, Processor
from statesnap.errors import HandlerError, StoreAccessError
from statesnap.processor.context import ProcessorContext, Record
from statesnap.processor.handler import ProcessorHandler
from statesnap.stores import open_state_store
from unit.processor_fakes import Message, Recorded

T0 = 1_700_000_000_000


def history(seed: int, *, n: int, keys: int) -> list[list[Message]]:
    """Batches of one partition: rising timestamps with some late ones, and records without key,
    value or timestamp, and values the handler cannot add (dead letters)."""
    rng = random.Random(seed)
    out: list[Message] = []
    ts = T0
    for offset in range(n):
        ts += rng.randrange(0, 400)
        stamp: int | None = ts - rng.randrange(0, 90_000) if rng.random() < 0.1 else ts
        key: bytes | None = b"k%d" % rng.randrange(keys)
        value: bytes | None = b'{"amount": %d}' % rng.randrange(100)
        roll = rng.random()
        if roll < 0.03:
            key = None
        elif roll < 0.06:
            value = None
        elif roll < 0.08:
            stamp = None
        elif roll < 0.09:
            value = b'{"amount": "x"}'
        out.append(Message(key, value, offset, stamp))
    cuts = sorted(rng.sample(range(1, n), 12))
    return [out[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]


def tally(record: Record, ctx: ProcessorContext) -> None:
    """Reads and writes a store, emits every change, fails on values it cannot add."""
    if record.key is None:
        ctx.skip()
        return
    totals = ctx.stores["t"]
    value = record.value
    amount = 0 if value is None else value["amount"] + 0  # a str amount raises: a dead letter
    totals[record.key] = total = totals.get(record.key, 0) + amount
    ctx.emit("out", record.key, total)


def last_offset(record: Record, ctx: ProcessorContext) -> None:
    if record.key is not None:
        ctx.stores["o"][record.key] = record.offset


def declare(proc: Processor, *, two: bool, punctuate: bool, tick_key: object) -> list[int]:
    proc.handler(tally)
    if two:
        proc.handler(last_offset)
    fired: list[int] = []
    if punctuate:

        @proc.punctuate("30s")
        def tick(ctx: ProcessorContext) -> None:
            fired.append(ctx.stream_time)
            ctx.stores["t"][tick_key] = ctx.stores["t"].get(tick_key, 0) + 1

    return fired


def run(*, bounded: bool, key_serde: Literal["string"] | None, two: bool, punctuate: bool) -> dict[str, Any]:
    proc = Processor(
        "p",
        inputs=["events"],
        bootstrap_servers="localhost:1",
        stores=["t", "o"],
        key_serde=key_serde,
        value_serde="json",
        processing=ProcessingOptions(dead_letter_topic="dead"),
    )
    fired = declare(proc, two=two, punctuate=punctuate, tick_key=b"ticks" if key_serde is None else "ticks")
    store = open_state_store("memory")
    outputs = Recorded(proc)
    handler: ProcessorHandler = proc.handler_for(store, outputs)
    if bounded:
        outputs.replay_until[0] = 0
    for batch in history(7, n=2000, keys=30):
        handler.apply(0, batch, None)
    rows = {
        p: list(zip(*(t.column(c).to_pylist() for c in ("key", "value", "offset", "timestamp")), strict=True))
        for p, t in store.export().items()
    }
    assert handler.cursor.thread == 0  # no call runs between batches: stores refuse every access
    return {
        "rows": rows,
        "skipped": handler.skipped,
        "dead": handler.dead_lettered,
        "processed": handler.processed,
        "sent": outputs.sent,
        "stream_time": handler.stream_time(0),
        "fired": fired,
    }


@pytest.mark.parametrize("key_serde", [None, "string"])
@pytest.mark.parametrize(("two", "punctuate"), [(False, False), (True, False), (False, True), (True, True)])
def test_a_replay_bound_below_every_record_changes_nothing_they_leave(
    key_serde: Literal["string"] | None, two: bool, punctuate: bool
) -> None:
    plain = run(bounded=False, key_serde=key_serde, two=two, punctuate=punctuate)
    bounded = run(bounded=True, key_serde=key_serde, two=two, punctuate=punctuate)
    assert plain == bounded
    assert plain["rows"]
    assert plain["sent"]
    assert plain["skipped"] > 0
    assert plain["dead"] > 0
    assert not punctuate or plain["fired"]


def test_a_failing_record_without_dead_letters_stops_with_nothing_of_it_written() -> None:
    proc = Processor(
        "p", inputs=["events"], bootstrap_servers="localhost:1", stores=["t"], value_serde="json"
    )
    proc.handler(tally)
    store = open_state_store("memory")
    handler = proc.handler_for(store, Recorded(proc))
    batch = [Message(b"a", b'{"amount": 1}', 0, 10), Message(b"a", b'{"amount": "x"}', 1, 11)]
    with pytest.raises(HandlerError, match=r"events\[0\]@1"):
        handler.apply(0, batch, None)
    assert handler.buffer.batch == {b"t\x00\x00\x00\x00\x00a": (b"1", 0, 10)}  # record 0's write only
    assert handler.cursor.thread == 0


def test_another_thread_is_refused_while_a_batch_runs() -> None:
    """The call's thread is set once per batch: a thread a handler starts still cannot use the
    stores, between records as during a call."""
    proc = Processor("p", inputs=["events"], bootstrap_servers="localhost:1", stores=["t"])
    errors: list[BaseException] = []
    seen: list[Callable[[], None]] = []

    @proc.handler
    def spawn(record: Record, ctx: ProcessorContext) -> None:
        def use() -> None:
            try:
                ctx.stores["t"][b"x"] = b"1"
            except StoreAccessError as e:
                errors.append(e)

        thread = threading.Thread(target=use)
        thread.start()
        thread.join()
        seen.append(use)

    handler = proc.handler_for(open_state_store("memory"), Recorded(proc))
    handler.apply(0, [Message(b"a", b"v", 0, 10), Message(b"b", b"v", 1, 11)], None)
    assert len(seen) == 2
    assert len(errors) == 2
    assert b"t\x00\x00\x00\x00\x00x" not in handler.buffer.batch
