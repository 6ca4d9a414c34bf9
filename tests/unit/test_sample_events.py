"""produce-sample's events (statesnap.sample): JSON values with an amount and their event time,
stream time rising, out-of-order and late records, tombstones and null keys in the fractions
asked for, the same records for the same seed (pure: no broker)."""

from __future__ import annotations

import json

import pytest

from statesnap.errors import ConfigError
from statesnap.sample import EventSpec, SampleSpec, sample_events

START = 1_800_000_000_000


def spec(disorder_ratio: float = 0.0, late_ratio: float = 0.0) -> SampleSpec:
    return SampleSpec(
        "payments",
        keys=50,
        updates=20_000,
        tombstone_ratio=0.02,
        seed=3,
        events=EventSpec(START, 100, disorder_ratio=disorder_ratio, late_ratio=late_ratio),
        null_key_ratio=0.01,
    )


def test_events_carry_their_time_and_come_in_the_fractions_asked_for() -> None:
    records = sample_events(spec(disorder_ratio=0.1, late_ratio=0.01))
    assert len(records) == 20_000
    assert records == sample_events(spec(disorder_ratio=0.1, late_ratio=0.01))  # same seed, same records
    newest = -1
    disordered = late = 0
    for i, (key, value, ts) in enumerate(records):
        assert ts is not None
        if value is not None:
            event = json.loads(value)
            assert event["id"] == i
            assert event["ts"] == ts
            assert 1 <= event["amount"] <= 99
        assert key is None or key.startswith(b"key-")
        if ts < newest - 120_000:
            late += 1
        elif ts < newest:
            disordered += 1
        newest = max(newest, ts)
        assert START + i * 100 - 240_000 <= ts < START + (i + 1) * 100
    assert 1_600 <= disordered <= 2_400
    assert 120 <= late <= 280
    assert 250 <= sum(v is None for _, v, _ in records) <= 550
    assert 120 <= sum(k is None for k, _, _ in records) <= 280


def test_in_order_events_rise_and_a_start_near_the_epoch_is_clamped_at_zero() -> None:
    records = sample_events(spec())
    times = [ts for _, _, ts in records if ts is not None]
    assert times == sorted(times)
    early = SampleSpec("t", updates=100, events=EventSpec(0, 10, late_ratio=1.0))
    assert min(ts for _, _, ts in sample_events(early) if ts is not None) == 0


def test_unanchored_events_end_about_now_and_bad_specs_are_refused() -> None:
    anchored = EventSpec().anchored(1000, now_ms=START)
    assert anchored.start_ms == START - 100_000
    with pytest.raises(ConfigError, match="at most 1"):
        EventSpec(disorder_ratio=0.6, late_ratio=0.6)
    with pytest.raises(ConfigError, match="null-key ratio"):
        SampleSpec("t", null_key_ratio=2.0)
