"""How rows travel over HTTP: key and value bytes as UTF-8 text or base64, the exact key bytes of
a lookup's path, and one page of an ordered scan — over :class:`Reads`, what a route reads (the
live replica or one generation)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote_to_bytes

from fastapi import HTTPException

if TYPE_CHECKING:
    from fastapi import Request

__all__ = ["Reads", "one_of", "page", "path_key", "text_or_b64"]


class Reads(Protocol):
    """The reads a route makes: of the live replica, or of one generation."""

    def get_raw(self, key: bytes) -> bytes | None: ...

    def scan(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]: ...

    def keeps(self, key: bytes) -> bool: ...


def text_or_b64(name: str, data: bytes) -> dict[str, str]:
    """``{name: text}`` when *data* is UTF-8, else ``{name_b64: base64}``."""
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode()}


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise HTTPException(400, f"{what} is not valid base64") from e


def path_key(request: Request, fallback: str) -> bytes:
    """The exact key bytes from the raw request path, so percent-encoded non-UTF-8 bytes and
    ``%2F`` survive; ``/tables/<name>/keys/`` is unambiguous because table names hold no '/'."""
    raw = request.scope.get("raw_path")
    root = str(request.scope.get("root_path", "")).encode()
    if isinstance(raw, bytes) and raw.startswith(root + b"/tables/"):
        rest = raw[len(root) + len(b"/tables/") :]
        _table, sep, tail = rest.partition(b"/")
        if sep and tail.startswith(b"keys/"):
            return unquote_to_bytes(tail[len(b"keys/") :])
    return fallback.encode("utf-8")


def one_of(text: str | None, b64: str | None, name: str) -> bytes | None:
    """The bytes of ``name`` or ``name_b64`` (at most one may be given)."""
    if text is not None and b64 is not None:
        raise HTTPException(400, f"give {name} or {name}_b64, not both")
    if b64 is not None:
        return _b64(b64, f"{name}_b64")
    return None if text is None else text.encode("utf-8")


def page(
    follower: Reads, after: bytes | None, prefix: bytes | None, limit: int
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """One page of the scan, and whether another may follow.

    Built on ``Follower.scan(after, limit)`` (ascending keys > *after*), so a page costs what one
    ordered read of *limit* rows costs. A prefix starts the scan at the prefix itself (its own key
    is looked up, since scan() starts strictly after) and ends the page at the first key past it.
    """
    rows: list[tuple[bytes, bytes]] = []
    if prefix and (after is None or after < prefix):
        own = follower.get_raw(prefix)
        if own is not None:
            rows.append((prefix, own))
        after = prefix
    if len(rows) < limit:
        batch = follower.scan(after, limit - len(rows))
        more = len(batch) == limit - len(rows)
        if prefix:
            kept = [kv for kv in batch if kv[0].startswith(prefix)]
            more = more and len(kept) == len(batch)
            batch = kept
        rows.extend(batch)
    else:
        more = True
    return rows, more
