"""The HTTP API of a follower: a thin FastAPI layer over :class:`~statesnap.follower.Follower`.

Every answer carries staleness headers, taken just before the read it describes (so the answer
reflects at least those offsets):

- ``X-Statesnap-Offsets``: JSON object partition → next offset to consume; every record below is
  reflected in the answer.
- ``X-Statesnap-Lag``: records behind, summed over partitions (0 when caught up; an estimate
  otherwise).
- ``X-Statesnap-Caught-Up``: ``true`` when every partition was at end-of-partition.
- ``X-Statesnap-Newest-Record-Age``: seconds since the newest applied record's timestamp.
- ``X-Statesnap-State``: ``restoring``, ``running``, ``failed`` or ``closed``.

A caller can demand a fresher answer: ``min_offsets={"0": 123}`` waits until the record at offset
123 of partition 0 (e.g. from a produce() delivery report) is applied — read-your-writes — and
``caught_up=true`` waits until every partition is at end-of-partition; both for at most
``wait_ms``, then 504.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at runtime and
# they refer to names local to create_app().
import base64
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes, urlencode

import anyio.to_thread
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field

from statesnap import __version__
from statesnap.errors import ConfigError, StatesnapError, TableStateError
from statesnap.follower import Follower
from statesnap.serve.metrics import CONTENT_TYPE, render_metrics

#: Default and maximum time a request may wait for ``min_offsets`` / ``caught_up``.
DEFAULT_WAIT_MS = 5_000
MAX_WAIT_MS = 60_000
#: Page size bounds of the key scan.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000
_FRESHNESS_KEY = "statesnap_freshness"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Freshness:
    """What an answer reflects; rendered as the ``X-Statesnap-*`` headers."""

    state: str
    offsets: dict[int, int]
    lag: int
    caught_up: bool
    newest_record_age: float | None

    @classmethod
    def of(cls, follower: Follower) -> "Freshness":
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
        offsets = json.dumps({str(p): o for p, o in sorted(self.offsets.items())}, separators=(",", ":"))
        out = [
            (b"x-statesnap-state", self.state.encode()),
            (b"x-statesnap-offsets", offsets.encode()),
            (b"x-statesnap-lag", str(self.lag).encode()),
            (b"x-statesnap-caught-up", b"true" if self.caught_up else b"false"),
        ]
        if self.newest_record_age is not None:
            out.append((b"x-statesnap-newest-record-age", f"{self.newest_record_age:.3f}".encode()))
        return out


class _FreshnessHeaders:
    """Pure ASGI middleware adding the staleness headers to every answer: the snapshot a handler
    took before its read, or a fresh one for answers without a read (errors, health, metrics)."""

    def __init__(self, app: ASGIApp, follower: Follower) -> None:
        self.app = app
        self.follower = follower

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = scope.setdefault("state", {})

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                snap = state.get(_FRESHNESS_KEY)
                if not isinstance(snap, Freshness):
                    snap = Freshness.of(self.follower)
                message["headers"] = [*message.get("headers", []), *snap.headers()]
            await send(message)

        await self.app(scope, receive, send_with_headers)


# --- response models (OpenAPI documentation of the JSON answers) ----------------------------------


class Item(BaseModel):
    """One row; text fields are UTF-8, the ``*_b64`` variant is used when the bytes are not."""

    key: str | None = Field(None, description="The key as UTF-8 text.")
    key_b64: str | None = Field(None, description="The key, base64, when it is not valid UTF-8.")
    value: str | None = Field(None, description="The value as UTF-8 text.")
    value_b64: str | None = Field(None, description="The value, base64, when it is not valid UTF-8.")


class ScanPage(BaseModel):
    table: str
    items: list[Item]
    next: str | None = Field(
        description="Relative URL of the next page (same limit), or null on the last page."
    )


class Problem(BaseModel):
    detail: Any = Field(description="What went wrong.")


class StatusModel(BaseModel):
    table: str
    topic: str
    state: str = Field(description="restoring, running, failed or closed")
    ready: bool
    caught_up: bool
    offsets: dict[str, int] = Field(description="Partition → next offset to consume.")
    lag: dict[str, int] = Field(description="Partition → records behind (estimate unless 0).")
    total_lag: int
    keys: int
    checkpoint_generation: int | None = Field(description="Checkpoint booted from; null after full replay.")
    restore_seconds: float | None
    replayed_records: int
    last_update_age: float | None = Field(description="Seconds since a record was last applied.")
    newest_record_age: float | None = Field(description="Seconds since the newest record's timestamp.")
    error: str | None


class HealthModel(StatusModel):
    status: str = Field(description="ok when ready, else the state")


def _text_or_b64(name: str, data: bytes) -> dict[str, str]:
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode()}


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise HTTPException(400, f"{what} is not valid base64") from e


def _path_key(request: Request, fallback: str) -> bytes:
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


def _parse_min_offsets(text: str) -> dict[int, int]:
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError("not an object")
        out = {int(p): int(o) for p, o in parsed.items()}
    except (ValueError, TypeError) as e:
        raise HTTPException(
            400, f'min_offsets must be a JSON object of partition → offset, e.g. {{"0": 123}}: {e}'
        ) from e
    if any(p < 0 or o < 0 for p, o in out.items()):
        raise HTTPException(400, "min_offsets: partitions and offsets must be >= 0")
    return out


def create_app(
    follower: Follower, *, default_wait_ms: int = DEFAULT_WAIT_MS, max_wait_ms: int = MAX_WAIT_MS
) -> FastAPI:
    """The HTTP API over *follower*. The app does not start or close the follower: its owner
    (``statesnap serve``, a test, an embedding service) does."""
    app = FastAPI(
        title=f"statesnap follower: {follower.name}",
        version=__version__,
        description=(__doc__ or "").split("\n\n", 1)[1],
        openapi_tags=[
            {"name": "table", "description": "Reads from the replica."},
            {"name": "operations", "description": "Health, status and metrics."},
        ],
    )
    app.add_middleware(_FreshnessHeaders, follower=follower)

    @app.exception_handler(TableStateError)
    async def _not_ready(_request: Request, exc: TableStateError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(StatesnapError)
    async def _replica_failed(_request: Request, exc: StatesnapError) -> JSONResponse:
        # The background consumer failed while a request waited on it (broker lost, …).
        detail = f"replica failed: {type(exc).__name__}: {exc}"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(ConfigError)
    async def _bad_request(_request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    def require_table(table: str) -> None:
        if table != follower.name:
            raise HTTPException(404, f"no table {table!r} here; this server follows {follower.name!r}")

    def require_running() -> None:
        state = follower.state
        if state != "running":
            raise HTTPException(
                503, f"table {follower.name!r} is {state}, not ready for reads", headers={"Retry-After": "1"}
            )

    async def consistency(
        request: Request,
        table: str,
        min_offsets: Annotated[
            str | None,
            Query(
                description='JSON object partition → offset of a record you wrote (e.g. {"0": 123}); '
                "the answer waits until every such record is applied (read-your-writes).",
                examples=['{"0": 123}'],
            ),
        ] = None,
        caught_up: Annotated[
            bool, Query(description="Wait until every partition is at end-of-partition.")
        ] = False,
        wait_ms: Annotated[
            int,
            Query(
                ge=0, le=max_wait_ms, description="How long to wait for min_offsets / caught_up; then 504."
            ),
        ] = default_wait_ms,
    ) -> None:
        """Table check, readiness, then the freshness the caller demands; records what the
        answer will reflect for the staleness headers."""
        require_table(table)
        require_running()
        timeout = wait_ms / 1000
        if min_offsets is not None:
            wanted = _parse_min_offsets(min_offsets)
            if wanted and not await anyio.to_thread.run_sync(
                lambda: follower.wait_for(wanted, timeout=timeout)
            ):
                raise HTTPException(
                    504,
                    {
                        "message": f"min_offsets not applied within {wait_ms} ms",
                        "wanted": {str(p): o for p, o in wanted.items()},
                        "offsets": {str(p): o for p, o in follower.offsets.items()},
                    },
                )
        if caught_up and not await anyio.to_thread.run_sync(lambda: follower.wait_caught_up(timeout)):
            raise HTTPException(504, f"not caught up within {wait_ms} ms")
        setattr(request.state, _FRESHNESS_KEY, Freshness.of(follower))

    errors: dict[int | str, dict[str, Any]] = {
        400: {"model": Problem, "description": "Malformed parameter (e.g. min_offsets)."},
        404: {"model": Problem, "description": "No such table on this server (or no such key)."},
        503: {"model": Problem, "description": "The replica is still restoring (or failed)."},
        504: {"model": Problem, "description": "min_offsets / caught_up not reached within wait_ms."},
    }

    @app.get(
        "/tables/{table}/keys",
        tags=["table"],
        summary="Scan keys in order, one page at a time",
        description="Up to `limit` rows with keys greater than `after` (or `after_b64`), ascending "
        "by key bytes. Keys and values are UTF-8 text, or base64 in `key_b64`/`value_b64` when "
        "they are not valid UTF-8. Follow `next` for the next page; it is null on the last page. "
        "Each page is a separate read: rows may change between pages while the replica tails.",
        response_model=ScanPage,
        responses=errors,
    )
    async def scan_keys(
        _consistent: Annotated[None, Depends(consistency)],
        table: str,
        after: Annotated[str | None, Query(description="Start after this key (UTF-8).")] = None,
        after_b64: Annotated[str | None, Query(description="Start after this key (base64).")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Rows per page.")] = DEFAULT_LIMIT,
    ) -> JSONResponse:
        if after is not None and after_b64 is not None:
            raise HTTPException(400, "give after or after_b64, not both")
        start = _b64(after_b64, "after_b64") if after_b64 is not None else None
        if after is not None:
            start = after.encode("utf-8")
        rows = await anyio.to_thread.run_sync(lambda: follower.scan(start, limit))
        items = [{**_text_or_b64("key", k), **_text_or_b64("value", v)} for k, v in rows]
        next_url = None
        if len(rows) == limit:
            cursor = _text_or_b64("after", rows[-1][0])
            next_url = f"/tables/{table}/keys?{urlencode({**cursor, 'limit': limit})}"
        return JSONResponse({"table": table, "items": items, "next": next_url})

    @app.get(
        "/tables/{table}/keys/{key:path}",
        tags=["table"],
        summary="Look up one key",
        description="The key is the rest of the path, percent-encoded (any bytes, `/` as `%2F`). "
        "Answers the value's raw bytes as `application/octet-stream`, or 404 when the replica holds "
        "no such key (absent, deleted, or not kept by its key filter).",
        response_class=Response,
        responses={
            200: {"content": {"application/octet-stream": {}}, "description": "The value's raw bytes."},
            **errors,
        },
    )
    async def get_key(
        _consistent: Annotated[None, Depends(consistency)], request: Request, table: str, key: str
    ) -> Response:
        raw_key = _path_key(request, key)
        value = follower.get_raw(raw_key)
        if value is None:
            detail = "key not found"
            if not follower.keeps(raw_key):
                detail = "key not found: this replica's key filter does not keep it"
            return JSONResponse({"detail": detail}, status_code=404)
        return Response(value, media_type="application/octet-stream")

    @app.get(
        "/tables/{table}",
        tags=["operations"],
        summary="Status of the replica",
        description="Offsets, lag, keys, the checkpoint it booted from and how fresh it is.",
        response_model=StatusModel,
        responses={404: errors[404]},
    )
    async def table_status(table: str) -> JSONResponse:
        require_table(table)
        return JSONResponse(follower.status().to_json())

    @app.get(
        "/health",
        tags=["operations"],
        summary="Readiness: 200 once restored and caught up, 503 before",
        description="200 once the replica has loaded its checkpoint and replayed the changelog up to "
        "end-of-partition on every partition, and its consumer is healthy; 503 while it is "
        "restoring or after it failed. The body is the replica's status.",
        response_model=HealthModel,
        responses={503: {"model": HealthModel, "description": "Restoring or failed."}},
    )
    async def health() -> JSONResponse:
        status = follower.status()
        body = {"status": "ok" if status.ready else status.state, **status.to_json()}
        return JSONResponse(body, status_code=200 if status.ready else 503)

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics",
        description="Keys, per-partition offsets and lag, restore seconds, checkpoint generation used, "
        "last update age, in the Prometheus text format.",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format 0.0.4."}},
    )
    async def metrics() -> Response:
        return Response(render_metrics(follower.status()), media_type=CONTENT_TYPE)

    return app
