"""Per-store migrations become row-level steps over the task's keyspace: the step sees the store's
own key (no prefix, no window start) and its row stays in its store, partition and window."""

from __future__ import annotations

import pytest

from statesnap import StoreSpec, Windows
from statesnap.errors import ConfigError
from statesnap.processor.keyspace import kv_key, partition_prefix, stream_time_key, window_bytes
from statesnap.processor.migrations import row_migrations

SPECS = {
    "balances": StoreSpec("balances"),
    "counts": StoreSpec("counts", window=Windows.tumbling("1m")),
    "other": StoreSpec("other"),
}


def test_a_store_step_sees_its_own_key_and_keeps_the_prefix() -> None:
    seen: list[bytes] = []

    def upper(key: bytes, value: bytes) -> tuple[bytes, bytes] | None:
        seen.append(key)
        return (key.upper(), value + b"!") if key != b"gone" else None

    (step,) = row_migrations("p", SPECS, {1: {"balances": upper, "counts": upper}}).values()
    assert step(kv_key(partition_prefix("balances", 3), b"ab"), b"1") == (
        kv_key(partition_prefix("balances", 3), b"AB"),
        b"1!",
        3,
    )
    window = partition_prefix("counts", 2) + window_bytes(60_000)
    assert step(window + b"k", b"v") == (window + b"K", b"v!", 2)
    assert step(kv_key(partition_prefix("balances", 0), b"gone"), b"x") is None
    untouched = kv_key(partition_prefix("other", 1), b"ab")
    assert step(untouched, b"1") == (untouched, b"1")
    assert step(stream_time_key(1), b"12345678") == (stream_time_key(1), b"12345678")
    assert seen == [b"ab", b"k", b"gone"]


def test_a_migration_naming_no_store_of_the_processor_is_refused() -> None:
    with pytest.raises(ConfigError, match="names store 'nope', which it does not have"):
        row_migrations("p", SPECS, {1: {"nope": lambda k, v: (k, v)}})
    with pytest.raises(ConfigError, match=r"must map store names to fn\(key, value\)"):
        row_migrations("p", SPECS, {1: lambda k, v: (k, v)})
