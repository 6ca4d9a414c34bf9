"""Join declarations refused in one line, before any record: the wrong kind of join, a side that
is not an input, a table given twice or not at all, a store that is not there; and JoinWindows
built as Kafka Streams' are."""

from __future__ import annotations

import pytest

from statesnap import JoinWindows, Processor
from statesnap.errors import ConfigError


def proc() -> Processor:
    return Processor("ads", inputs=["clicks", "impressions", "ads"], bootstrap_servers="127.0.0.1:1")


WINDOW = JoinWindows.of("10s")


def test_join_windows_read_like_kafka_streams() -> None:
    window = JoinWindows.of("5s", grace="1s").before("10m")
    assert (window.before_ms, window.after_ms, window.grace_ms) == (600_000, 5_000, 1_000)
    assert window.retention_ms == 606_000
    with pytest.raises(ConfigError, match="must not be negative"):
        JoinWindows(-1, 5)


@pytest.mark.parametrize(
    ("declare", "says"),
    [
        (lambda p: p.join("j", left="clicks", right="impressions", window=WINDOW, how="full", to="o"),
         "how must be one of 'inner', 'left', 'outer'"),
        (lambda p: p.join("j", left="clicks", right="views", window=WINDOW, to="o"),
         "right 'views' is not an input"),
        (lambda p: p.join("j", left="clicks", right="clicks", window=WINDOW, to="o"),
         "two sides must be different"),
        (lambda p: p.join_table("t", stream="clicks", table="ads", how="outer", to="o"),
         "how must be one of 'inner', 'left'"),
        (lambda p: p.join_table("t", stream="clicks", to="o"), "give the table as table="),
        (lambda p: p.join_table("t", stream="clicks", table="ads", store="s", to="o"),
         "give the table as table="),
        (lambda p: p.join_table("t", stream="clicks", store="nope", to="o"),
         "store='nope' is not a key-value"),
    ],
)  # fmt: skip
def test_bad_join_declarations_are_refused(declare: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        declare(proc())  # type: ignore[operator]


def test_a_join_declares_its_stores() -> None:
    p = proc()
    p.join("j", left="clicks", right="impressions", window=WINDOW, how="outer", to="o")
    p.join_table("t", stream="clicks", table="ads", to="o2")
    assert {"j-left", "j-right", "j-clock", "j-unmatched", "t"} <= set(p.stores)
    inner = proc()
    inner.join("j", left="clicks", right="impressions", window=WINDOW, to="o")
    assert "j-unmatched" not in inner.stores  # an inner join never sends unmatched records
