"""Progress bars on stderr, so stdout stays clean for ``--json`` and piping."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

stderr = Console(stderr=True)


@contextmanager
def progress_bar(quiet: bool = False) -> Iterator[Progress]:
    """A rich progress display on stderr; disabled when *quiet* or stderr is not a terminal."""
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=stderr,
        disable=quiet,
        transient=False,
    ) as progress:
        yield progress
