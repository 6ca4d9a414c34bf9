"""Every command's ``--help`` ends with the page of the documentation that explains it (issue
#35), and that page is in the repository: a command added without ``@docs_page``, or a page moved
or renamed under ``docs/``, fails here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from statesnap.cli import cli

REPO = Path(__file__).resolve().parents[2]
DOCS_LINE = re.compile(r"^\s*Docs: (docs/\S+\.md)\s*$")


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


COMMANDS = list(_commands(cli))


def test_the_walk_finds_every_level() -> None:
    """The walk reaches the root, plain commands and subcommands of groups (else the test below
    would pass on fewer commands than there are)."""
    for path in [(), ("materialize",), ("checkpoints",), ("checkpoints", "list"), ("snapshot", "diff")]:
        assert path in COMMANDS
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(("statesnap", *p)))
def test_help_ends_with_an_existing_docs_page(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="statesnap")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    found = DOCS_LINE.match(lines[-1])
    command = " ".join(("statesnap", *path))
    assert found, f"the last line of `{command} --help` names no docs page: {lines[-1]!r}"
    assert (REPO / found.group(1)).is_file(), f"{found.group(1)} ({command}) is not in the repo"


@pytest.mark.parametrize(
    ("path", "page"),
    [
        ((), "docs/index.md"),
        (("broker",), "docs/tutorials/tables.md"),
        (("produce-sample",), "docs/tutorials/processors.md"),
        (("materialize",), "docs/tutorials/tables.md"),
        (("dump",), "docs/reading-checkpoints.md"),
        (("run",), "docs/tutorials/processors.md"),
        (("checkpoints", "gc"), "docs/how-to/checkpoints.md"),
        (("snapshot", "create"), "docs/how-to/snapshots.md"),
        (("serve",), "docs/reference/http.md"),
        (("demo",), "docs/index.md"),
        (("sql",), "docs/how-to/incident-sql.md"),
    ],
)
def test_each_command_names_its_own_page(path: tuple[str, ...], page: str) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="statesnap")
    assert f"Docs: {page}" in result.output
