"""MkDocs hooks.

The CLI reference page is the CLI's own ``--help``, read when the site builds, so
the page cannot drift from what ``statesnap COMMAND --help`` prints.

``<!-- cli-help -->`` in a page becomes one section per command and subcommand, in the order the
CLI registers them, each with its help text as the terminal shows it.

The docstrings use Sphinx's roles (``:class:`Table```), which Markdown renders as the role's name
before the code span; the role names are dropped from the page so ``Table`` reads as code.
"""

from __future__ import annotations

import re
from typing import Any

import click

MARKER = "<!-- cli-help -->"
_ROLE = re.compile(r":(?:class|mod|meth|func|attr|data|exc|obj|py:\w+):(?=<code>)")


def _sections(command: click.Command, path: list[str]) -> list[str]:
    with click.Context(command, info_name=" ".join(path), terminal_width=100) as ctx:
        text = command.get_help(ctx)
    sections = [f"## `{' '.join(path)}`\n\n```text\n{text}\n```\n"]
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            if sub is not None and not sub.hidden:
                sections.extend(_sections(sub, [*path, name]))
    return sections


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from statesnap.cli import cli

    return markdown.replace(MARKER, "\n".join(_sections(cli, ["statesnap"])))


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub("", html)
