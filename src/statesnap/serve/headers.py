"""What an answer reflects, as the ``X-Statesnap-*`` headers (their meaning: the API description
in :mod:`statesnap.serve.app`).

A handler records what it read (:func:`record`) just before reading, so the headers describe at
least the state the answer reflects; :class:`FreshnessHeaders` adds them to every answer, and
takes a fresh sample for answers that read nothing (errors, health, metrics).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import Request

    from statesnap.serve.asgi import ASGIApp, Message, Receive, Scope, Send
    from statesnap.serve.waits import ServedReplica

__all__ = ["Freshness", "FreshnessHeaders", "SnapshotFreshness", "record", "recorded"]

#: Where a handler leaves what its answer reflects, in the request's (ASGI scope's) state.
_KEY = "statesnap_freshness"


def _offsets_header(offsets: dict[int, int]) -> bytes:
    return json.dumps({str(p): o for p, o in sorted(offsets.items())}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Freshness:
    """What an answer of the live replica reflects."""

    state: str
    offsets: dict[int, int]
    lag: int
    caught_up: bool
    newest_record_age: float | None

    @classmethod
    def of(cls, follower: ServedReplica) -> Freshness:
        # Offsets first: the answer that follows reflects at least these.
        offsets = follower.offsets
        return cls(
            follower.state,
            offsets,
            sum(follower.lag().values()),
            follower.caught_up,
            follower.newest_record_age(),
        )

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [
            (b"x-statesnap-state", self.state.encode()),
            (b"x-statesnap-offsets", _offsets_header(self.offsets)),
            (b"x-statesnap-lag", str(self.lag).encode()),
            (b"x-statesnap-caught-up", b"true" if self.caught_up else b"false"),
        ]
        if self.newest_record_age is not None:
            out.append((b"x-statesnap-newest-record-age", f"{self.newest_record_age:.3f}".encode()))
        return out


@dataclass(frozen=True, slots=True)
class SnapshotFreshness:
    """What a ``?generation=G`` answer reflects: generation G, at G's offsets, never moving (so no
    lag, state or caught-up)."""

    generation: int
    offsets: dict[int, int]

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-statesnap-generation", str(self.generation).encode()),
            (b"x-statesnap-offsets", _offsets_header(self.offsets)),
        ]


def record(request: Request, reflects: Freshness | SnapshotFreshness) -> None:
    """Note what *request*'s answer reflects, for its headers (call just before the read)."""
    setattr(request.state, _KEY, reflects)


def recorded(request: Request) -> Freshness | SnapshotFreshness | None:
    """What :func:`record` noted for *request*, if anything."""
    reflects = getattr(request.state, _KEY, None)
    return reflects if isinstance(reflects, Freshness | SnapshotFreshness) else None


class FreshnessHeaders:
    """Pure ASGI middleware adding the staleness headers to every answer: the snapshot a handler
    took before its read, or a fresh one for answers without a read (errors, health, metrics)."""

    def __init__(self, app: ASGIApp, follower: ServedReplica) -> None:
        self.app = app
        self.follower = follower

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                snap = state.get(_KEY)
                if not isinstance(snap, Freshness | SnapshotFreshness):
                    snap = Freshness.of(self.follower)
                message["headers"] = [*message.get("headers", []), *snap.headers()]
            await send(message)

        await self.app(scope, receive, send_with_headers)
