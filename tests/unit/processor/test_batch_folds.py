"""A declared aggregation folded per batch leaves exactly what the per-record path leaves: the
same rows (values, offsets, timestamps), the same skips and dead letters, the same outputs in the
same order (issue #36, item 1). Each case runs the same records through both paths — the
per-record one forced by switching the batch fold off — over a real store, no broker (the
outputs' producer is a recorder)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from statesnap import ProcessingOptions, Processor, Windows
from statesnap.processor.handler import ProcessorHandler
from statesnap.stores import open_state_store
from unit.processor_fakes import Message, Recorded

T0 = 1_700_000_000_000 // 60_000 * 60_000  # a minute's start: grid timestamps fall on window bounds


def history(
    seed: int, *, n: int = 3000, keys: int = 40, plain: bool = False, grid: bool = False
) -> list[list[Message]]:
    """Batches of one partition: mostly rising timestamps, some late ones, and (unless *plain*)
    records without key, without value, without timestamp, and values a sum cannot add. *grid*:
    timestamps on a 5 s grid, so records land exactly on window ends and grace bounds."""
    rng = random.Random(seed)
    out: list[Message] = []
    ts = T0
    step, late = (5_000, 5_000) if grid else (1, 1)
    for offset in range(n):
        ts += rng.randrange(0, 400) // 100 * step if grid else rng.randrange(0, 400)
        stamp: int | None = ts - rng.randrange(0, 90_000) // late * late if rng.random() < 0.1 else ts
        key: bytes | None = b"k%d" % rng.randrange(keys)
        value: bytes | None = b'{"amount": %d}' % rng.randrange(100)
        if not plain:
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


def run(
    declare: Callable[[Processor], object],
    batches: list[list[Message]],
    *,
    batched: bool,
    hold: int | None = None,
) -> dict[str, Any]:
    """The batches through one handler; *hold*: its writes held (at most that many keys), as a
    Python task holds them (statesnap.processor.buffer), and handed to the store at the end."""
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
    handler: ProcessorHandler = proc.handler_for(store, outputs)
    assert (handler._batched is not None) is True
    if not batched:
        handler._batched = None
    if hold is not None:
        assert handler.hold_writes()
        handler.buffer.hold = hold
    for batch in batches:
        handler.apply(0, batch, None)
    handler.buffer.flush()
    rows = {
        p: list(zip(*(t.column(c).to_pylist() for c in ("key", "value", "offset", "timestamp")), strict=True))
        for p, t in store.export().items()
    }
    return {
        "rows": rows,
        "skipped": handler.skipped,
        "dead": handler.dead_lettered,
        "processed": handler.processed,
        "sent": outputs.sent,
        "stream_time": handler.stream_time(0),
    }


CASES: dict[str, Callable[[Processor], object]] = {
    "count": lambda p: p.count("c"),
    "count to": lambda p: p.count("c", to="out"),
    "sum": lambda p: p.sum("c", "amount"),
    "sum to": lambda p: p.sum("c", "amount", to="out"),
    "reduce": lambda p: p.reduce("c", max, value="amount"),
    "aggregate": lambda p: p.aggregate("c", list, lambda a, r: [*a[-2:], r.offset]),
    "window count": lambda p: p.count("c", window=Windows.tumbling("1m")),
    # a retention of a day keeps every window in the store: each one's count is compared
    "window count kept": lambda p: p.count("c", window=Windows.tumbling("1m", retention="1d")),
    "window count grace": lambda p: p.count("c", window=Windows.tumbling("1m", grace="20s", retention="1d")),
    "window count to": lambda p: p.count("c", window=Windows.tumbling("1m", grace="5s"), to="out"),
    "hopping count": lambda p: p.count(
        "c", window=Windows.hopping("1m", advance="20s", grace="10s", retention="1d")
    ),
    "window sum to": lambda p: p.sum("c", "amount", window=Windows.hopping("30s", advance="10s"), to="out"),
    "window aggregate": lambda p: p.aggregate(
        "c", lambda: 0, lambda a, r: a + (0 if r.value is None else 1), window=Windows.tumbling("30s")
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("plain", "grid"), [(False, False), (True, False), (False, True), (True, True)])
def test_batch_fold_equals_the_per_record_path(case: str, plain: bool, grid: bool) -> None:
    batches = history(sum(case.encode()), plain=plain, grid=grid)
    per_record = run(CASES[case], batches, batched=False)
    per_batch = run(CASES[case], batches, batched=True)
    assert per_batch == per_record
    assert per_record["rows"]  # the case stored something: the comparison is not of nothing
    if not plain:
        assert per_record["skipped"] > 0


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("hold", [262_144, 10])
@pytest.mark.parametrize(("plain", "grid"), [(False, False), (True, False), (True, True)])
def test_held_batch_folds_equal_the_per_record_path(case: str, hold: int, plain: bool, grid: bool) -> None:
    """Folds whose writes a Python task holds across batches (read back from what is held,
    handed over when more than *hold* keys are; windows that expire meanwhile dropped from what
    is held) leave what the per-record path leaves, which writes every batch's end."""
    batches = history(sum(case.encode()), plain=plain, grid=grid)
    per_record = run(CASES[case], batches, batched=False)
    held = run(CASES[case], batches, batched=True, hold=hold)
    assert held == per_record
    assert per_record["rows"]
    held_per_record = run(CASES[case], batches, batched=False, hold=hold)
    assert held_per_record == per_record


def test_a_declared_aggregation_beside_another_step_runs_per_record() -> None:
    proc = Processor("p", inputs=["events"], bootstrap_servers="localhost:1", value_serde="json")
    proc.count("c")
    proc.count("d", window=Windows.tumbling("1m"), emit="final", to="out")  # a punctuator too
    handler = proc.handler_for(open_state_store("memory"), Recorded(proc))
    assert handler._batched is None
