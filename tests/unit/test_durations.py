"""Human durations: the spelling every interval option (CLI and API) accepts."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statesnap.durations import format_duration, parse_duration
from statesnap.errors import ConfigError, InvalidDurationError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("12h", timedelta(hours=12)),
        ("2d", timedelta(days=2)),
        ("1w", timedelta(weeks=1)),
        ("250ms", timedelta(milliseconds=250)),
        ("1.5h", timedelta(minutes=90)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("30", timedelta(seconds=30)),
        (" 5m ", timedelta(minutes=5)),
        ("5 m", timedelta(minutes=5)),
        (30, timedelta(seconds=30)),
        (2.5, timedelta(seconds=2.5)),
        (0, timedelta(0)),
        (timedelta(hours=3), timedelta(hours=3)),
    ],
)
def test_parses_human_durations(text: str | float | timedelta, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "bad",
    ["-5m", "-1", " -2d", "-0.5s", -1, -0.001, timedelta(seconds=-1)],
)
def test_negative_durations_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidDurationError, match="negative"):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "abc",
        "5x",
        "m5",
        "5mm",
        "5 m m",
        "1e3s",
        "1,5h",
        "5 minutes",
        "h",
        "nan",
        "inf",
        ".5s",
        "5.s",
        "0x10s",
        None,
        [],
        {},
        True,
        b"5m",
    ],
)
def test_garbage_is_rejected_with_a_typed_error(bad: object) -> None:
    with pytest.raises(InvalidDurationError) as info:
        parse_duration(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ConfigError)  # callers may catch ConfigError for any bad setting
    if isinstance(bad, str) and bad.strip():
        assert repr(bad) in str(info.value)  # the message names the offending text


@pytest.mark.parametrize("secret", ["sk-live-AAAABBBBCCCC", "hunter2secret", "p@ss", "-SeCrEt-token", "1Ab$"])
def test_a_value_that_is_no_duration_at_all_is_described_not_echoed(secret: str) -> None:
    """Something pasted into the wrong option (a password, a token) must never be printed: the
    error echoes only what starts like a duration or is a short word, and describes the rest."""
    with pytest.raises(InvalidDurationError) as info:
        parse_duration(secret)
    message = str(info.value)
    assert secret not in message
    assert f"of {len(secret)} characters (not shown" in message
    assert "use a number with a unit" in message or "negative" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "9999999999d", "99999999999999999999w"])
def test_non_finite_and_overflowing_durations_are_typed_errors(bad: object) -> None:
    """Non-finite numbers and durations beyond ``timedelta.max`` must not escape as a bare
    ``ValueError``/``OverflowError`` traceback: an operator typing ``--min-age 9999999999d``
    deserves the same typed error as for any other bad duration."""
    with pytest.raises(InvalidDurationError):
        parse_duration(bad)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=10**9))
def test_format_then_parse_is_exact_for_whole_seconds(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    assert parse_duration(format_duration(value)) == value


@given(st.integers(min_value=0, max_value=10**12))
def test_format_then_parse_is_exact_for_whole_milliseconds(millis: int) -> None:
    """format_duration promises "the shortest *exact* spelling in the units parse_duration
    reads"; that must hold for millisecond values too (e.g. 1234567.5 s)."""
    value = timedelta(milliseconds=millis)
    text = format_duration(value)
    parsed = parse_duration(text)
    assert math.isclose(parsed.total_seconds(), value.total_seconds(), rel_tol=0, abs_tol=1e-6), text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(seconds=90), "90s"),
        (timedelta(minutes=5), "5m"),
        (timedelta(hours=12), "12h"),
        (timedelta(days=2), "2d"),
        (timedelta(0), "0s"),
        (timedelta(hours=36), "36h"),
    ],
)
def test_format_picks_the_largest_exact_unit(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
