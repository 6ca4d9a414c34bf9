"""What a closed task keeps of a failure: the error and its printable traceback, not the locals
of the calls that failed (they held the task's Kafka clients)."""

from __future__ import annotations

import sys
import traceback
import weakref

import pytest

from statesnap.task.lifecycle import release_locals


class Client:
    """Stands in for a Kafka client a failing call held in a local."""


def fails_holding(client: Client) -> None:
    held = client  # noqa: F841 - the local the traceback keeps alive
    raise KeyError("lost")


def wraps(client: Client) -> None:
    try:
        fails_holding(client)
    except KeyError as e:
        raise RuntimeError("wrapped") from e


def caught() -> tuple[BaseException, weakref.ref[Client]]:
    client = Client()
    try:
        wraps(client)
    except RuntimeError as e:
        return e, weakref.ref(client)
    raise AssertionError("not raised")


def test_the_failed_calls_locals_go_and_the_traceback_still_prints() -> None:
    error, client = caught()
    assert client() is not None  # only the error's frames hold it now
    before = "".join(traceback.format_exception(error))

    release_locals(error)

    assert client() is None
    assert "".join(traceback.format_exception(error)) == before
    assert "in fails_holding" in before


def test_a_cycle_of_chained_errors_and_a_frame_still_running_are_left_whole() -> None:
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first
    release_locals(first)  # terminates on the cycle

    still = Client()
    try:
        raise KeyError("here")
    except KeyError as e:
        release_locals(e)  # this frame is executing: its locals stay
        assert sys._getframe().f_locals["still"] is still


def test_an_error_without_a_traceback_is_fine() -> None:
    release_locals(ValueError("never raised"))
    with pytest.raises(ValueError, match="never raised"):
        raise ValueError("never raised")
