"""The code blocks of the README and the documentation site, read as a reader meets them.

A page is a short program in several parts: its blocks run in document order, in one fresh working
directory (so ``./ckpt`` starts empty), each in a fresh process of the venv's interpreter. The rules
a page's author follows (docs/index.md's "How these pages are tested" says them to readers):

- ```` ```python ```` runs as a script; ```` ```python title="app.py" ```` is a file the reader
  saves: it is written to the working directory as *app.py* and runs when a later block runs it.
- ```` ```bash ```` runs under ``bash -euo pipefail`` with the venv's ``bin/`` first on ``PATH``.
- ```` ```text ```` and ```` ```json ```` show output or data and do not run. No other language is
  allowed: a block that cannot run is a block nobody checks.
- ``<!-- docs-test: background -->`` before a bash block starts it in the background (a broker);
  the page waits for its first line of output and stops it when the page ends.
- ``<!-- docs-test: by tests/PATH.py NAME -->`` before a block says a dedicated test runs it with
  the inputs it names (a recipe over a prepared checkpoint, a ``spark-submit`` to a standalone
  master): the test file must exist and name *NAME*, where it picks the block out by this directive.
- ``<!-- docs-test: skip REASON -->`` before a block leaves it out, with the reason (setup commands
  that CI itself runs); the test lists every skip, so they stay few and visible.
- The address ``127.0.0.1:9092`` means "the broker": the test puts the session's broker (or the
  page's own background one) in its place; S3 blocks find the test's S3 endpoint in the standard
  ``AWS_*`` environment variables, as a reader's do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = {"python", "bash"}
SHOWN = {"text", "json"}
_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.S | re.M)
_DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(?P<word>\w+)\s*(?P<rest>.*?)\s*-->\s*$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')


class Kind(Enum):
    """What the runner does with a block."""

    RUN = "run"
    FILE = "file"
    BACKGROUND = "background"
    SHOWN = "shown"
    BY_TEST = "by-test"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and what the runner does with it."""

    page: str
    line: int
    language: str
    body: str
    kind: Kind
    title: str | None = None
    #: Why a skipped block is left out; for a block run by a dedicated test, ``PATH NAME``.
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of *path*, in order, each with what the runner does with it."""
    text = path.read_text()
    found: list[Block] = []
    for match in _FENCE.finditer(text):
        info = match.group("info").strip()
        language = info.split(" ", 1)[0] if info else ""
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        directive = _DIRECTIVE.search(before)
        title = _TITLE.search(info)
        body = re.sub(rf"(?m)^{match.group('indent')}", "", match.group("body"))
        kind = Kind.RUN
        reason = ""
        if directive and directive.group("word") == "skip":
            kind, reason = Kind.SKIPPED, directive.group("rest")
        elif directive and directive.group("word") == "by":
            kind, reason = Kind.BY_TEST, directive.group("rest")
        elif directive and directive.group("word") == "background":
            kind = Kind.BACKGROUND
        elif directive:
            word = directive.group("word")
            raise ValueError(f"{page_name(path)}:{line}: unknown docs-test directive {word!r}")
        elif language in SHOWN:
            kind = Kind.SHOWN
        elif title is not None:
            kind = Kind.FILE
        name = title.group("title") if title else None
        found.append(Block(page_name(path), line, language, body, kind, name, reason))
    return found


def by_test(path: Path, name: str) -> list[str]:
    """The bodies of *path*'s blocks marked ``<!-- docs-test: by … NAME -->``, for the dedicated
    test that runs them."""
    return [b.body for b in blocks(path) if b.kind is Kind.BY_TEST and b.reason.split()[-1] == name]
