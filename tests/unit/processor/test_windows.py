"""Window arithmetic and the keyspace encoding (pure functions; no broker)."""

from __future__ import annotations

import pytest

from statesnap import Windows
from statesnap.errors import ConfigError
from statesnap.processor.keyspace import partition_prefix, split_key, window_bytes, window_start_of


def test_tumbling_window_holds_each_timestamp_once() -> None:
    w = Windows.tumbling("1m")
    assert w.starts(0) == [0]
    assert w.starts(59_999) == [0]
    assert w.starts(60_000) == [60_000]
    assert w.starts(-1) == []  # no window starts below the epoch (Kafka Streams' rule)
    assert w.retention_ms == 60_000


def test_hopping_windows_near_the_epoch_start_at_zero() -> None:
    """Kafka Streams clamps a hopping window's start at 0: a record at 3 s of a 10 s window
    advancing by 5 s is in [0, 10 s) only, not also in [-5 s, 5 s)."""
    w = Windows.hopping("10s", advance="5s")
    assert w.starts(3_000) == [0]
    assert w.starts(7_000) == [0, 5_000]


def test_hopping_windows_overlap() -> None:
    w = Windows.hopping("10s", advance="5s", grace="2s", retention="1m")
    assert w.starts(12_000) == [5_000, 10_000]
    assert not w.closed(5_000, 16_999)
    assert w.closed(5_000, 17_000)
    assert not w.expired(5_000, 64_999)
    assert w.expired(5_000, 65_000)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Windows.hopping("10s", advance="20s"), "advance"),
        (lambda: Windows.tumbling("0s"), "size must be positive"),
        (lambda: Windows.tumbling("1m", grace="30s", retention="1m"), "retention"),
    ],
)
def test_impossible_windows_are_refused_in_one_line(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]


def test_window_keys_sort_by_time_even_before_the_epoch() -> None:
    starts = [-120_000, -60_000, 0, 60_000, 2**40]
    encoded = [window_bytes(s) for s in starts]
    assert encoded == sorted(encoded)
    assert [window_start_of(e) for e in encoded] == starts


def test_a_stored_key_names_its_store_and_partition() -> None:
    stored = partition_prefix("balances", 7) + b"acct-1"
    assert split_key(stored) == ("balances", 7, b"acct-1")
