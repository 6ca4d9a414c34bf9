"""``--engine spark``: materialize on PySpark (wired to :mod:`statesnap.spark`)."""

from __future__ import annotations

from typing import Any


def materialize_on_spark(**kwargs: Any) -> None:
    raise NotImplementedError


def diff_on_spark(api: Any, old: int, new: int) -> Any:
    raise NotImplementedError
