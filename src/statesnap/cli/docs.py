"""Each command's help names the page of the documentation that explains it (issue #35).

One decorator, :func:`docs_page`, on every command and group: it appends ``Docs: docs/<page>``
as the last paragraph of the command's help, after any examples, so ``--help`` sends a reader to
the page that teaches the command. A unit test walks the whole command tree and checks that each
help names a page and that the page exists in the repository.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

__all__ = ["DOCS_PREFIX", "docs_page"]

#: How the line starts; the test looks for it.
DOCS_PREFIX = "Docs: "

C = TypeVar("C", bound=click.Command)


def docs_page(page: str) -> Callable[[C], C]:
    """Decorate a click command (above ``@click.command``/``@group.command``) with the line
    ``Docs: docs/<page>``; *page* is relative to ``docs/`` (``tutorials/tables.md``)."""
    line = f"{DOCS_PREFIX}docs/{page}"

    def deco(command: C) -> C:
        # A paragraph of its own: click rewraps paragraphs, and a "\b" block (the examples) would
        # otherwise swallow the line.
        command.epilog = f"{command.epilog.rstrip()}\n\n{line}" if command.epilog else line
        return command

    return deco
