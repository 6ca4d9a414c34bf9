"""How a command prints: one result, as ``--json`` (one object on stdout) or as the sentence a
person reads; status lines and progress on stderr, never with ``--json`` or ``--quiet``.

Commands call the library, get a typed result back and hand it to :class:`Output`: the
library never prints, and no command decides twice how to show something.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import click

__all__ = ["Output", "Printable", "emit_json"]


class Printable(Protocol):
    """A command's result: its ``--json`` object and its human sentence."""

    def to_json(self) -> dict[str, Any]: ...

    def summary(self) -> str: ...


def emit_json(obj: Any) -> None:
    """One JSON document on stdout, flushed (a pipe's reader gets it at once)."""
    json.dump(obj, sys.stdout, indent=None, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class Output:
    """Where a command's output goes: ``as_json`` from ``--json``, ``quiet`` from ``--quiet``."""

    as_json: bool = False
    quiet: bool = False

    @property
    def shows_progress(self) -> bool:
        """Whether progress and status lines go to stderr (not with --json or --quiet)."""
        return not (self.as_json or self.quiet)

    def result(self, result: Printable) -> None:
        """The command's result: its JSON object, or its sentence."""
        if self.as_json:
            emit_json(result.to_json())
        else:
            click.echo(result.summary())

    def show(self, data: Any, text: str | Iterable[str]) -> None:
        """*data* as JSON, or *text* (a line, or lines: a generator is only run without --json)."""
        if self.as_json:
            emit_json(data)
            return
        for line in [text] if isinstance(text, str) else text:
            click.echo(line)

    def status(self, line: str) -> None:
        """A line for a person on stderr, unless --json or --quiet."""
        if self.shows_progress:
            click.echo(line, err=True)
