"""The HTTP API of a follower: a thin FastAPI layer over :class:`~statesnap.python.follower.Follower`
(or a processor store's :class:`~statesnap.processor.store_follower.StoreFollower`).

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
``wait_ms``, then 504. ``min_offsets`` also takes the form ``0:123,3:9``, which needs no URL
quoting. Waiting requests hold no thread: other requests are never queued behind them.

``generation=G`` answers a read as of snapshot generation G instead: exactly the state G's
checkpoint holds, never moving (404 listing the generations there are when G is not one of them;
500 when G does not verify — never another generation). Such answers carry
``X-Statesnap-Generation: G`` and ``X-Statesnap-Offsets`` = G's offsets (no lag or caught-up: a
snapshot does not move, so ``min_offsets`` and ``caught_up`` with it are a 400). The first read of
a generation loads it (waiting at most ``wait_ms``, then 504 while the load goes on); the server
keeps the few most recently read generations in memory.

Malformed or out-of-range parameters answer 400 with the reason.

Length: one FastAPI app — its routes, their typed models (which the OpenAPI document shows) and
the headers every answer carries; metrics, waits, params and docs are modules of their own.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at runtime and
# they refer to names local to create_app().
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any, Protocol
from urllib.parse import unquote_to_bytes, urlencode

import anyio.to_thread
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from statesnap.errors import (
    CheckpointError,
    ConfigError,
    GenerationNotFoundError,
    StatesnapError,
    TableNotFoundError,
    TableStateError,
)
from statesnap.redaction import scrub
from statesnap.serve.docs import mount_docs
from statesnap.serve.generations import DEFAULT_LOAD_SECONDS, GenerationCache, GenerationLoadTimeoutError
from statesnap.serve.metrics import CONTENT_TYPE, FollowerCollector, HttpMetrics, MetricsMiddleware, render
from statesnap.serve.params import ParameterError, parse_min_offsets
from statesnap.serve.waits import DEFAULT_MAX_PENDING, FreshnessWaits, ServedReplica
from statesnap.version import __version__

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_WAIT_MS",
    "MAX_LIMIT",
    "MAX_WAIT_MS",
    "ASGIApp",
    "Freshness",
    "HealthModel",
    "Item",
    "Message",
    "Problem",
    "Reads",
    "Receive",
    "ScanPage",
    "Scope",
    "Send",
    "SnapshotFreshness",
    "StatusModel",
    "create_app",
]

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
    def of(cls, follower: ServedReplica) -> "Freshness":
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


@dataclass(frozen=True, slots=True)
class SnapshotFreshness:
    """What a ``?generation=G`` answer reflects: generation G, at G's offsets, never moving."""

    generation: int
    offsets: dict[int, int]

    def headers(self) -> list[tuple[bytes, bytes]]:
        offsets = json.dumps({str(p): o for p, o in sorted(self.offsets.items())}, separators=(",", ":"))
        return [
            (b"x-statesnap-generation", str(self.generation).encode()),
            (b"x-statesnap-offsets", offsets.encode()),
        ]


class Reads(Protocol):
    """The reads a route makes: of the live replica, or of one generation."""

    def get_raw(self, key: bytes) -> bytes | None: ...

    def scan(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]: ...

    def keeps(self, key: bytes) -> bool: ...


class _FreshnessHeaders:
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
                snap = state.get(_FRESHNESS_KEY)
                if not isinstance(snap, Freshness | SnapshotFreshness):
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


def _one_of(text: str | None, b64: str | None, name: str) -> bytes | None:
    """The bytes of ``name`` or ``name_b64`` (at most one may be given)."""
    if text is not None and b64 is not None:
        raise HTTPException(400, f"give {name} or {name}_b64, not both")
    if b64 is not None:
        return _b64(b64, f"{name}_b64")
    return None if text is None else text.encode("utf-8")


def _page(
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


def _held(generations: GenerationCache) -> list[int]:
    """The generations there are, oldest first, for a 404; empty when even the listing fails."""
    try:
        return sorted(generations.generations())
    except StatesnapError:
        return []


def _validation_detail(exc: RequestValidationError) -> str:
    """FastAPI's validation errors as one line: ``wait_ms: Input should be less than or equal to …``."""
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "path", "header")]
        parts.append(f"{'.'.join(loc) or 'request'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _validation_errors(exc: RequestValidationError) -> list[Any]:
    """pydantic's errors without the ``input`` each one echoes: a 5000-digit ``wait_ms`` came back
    whole (and an int of that size cannot even be JSON-encoded); the type, location and message say
    what is wrong."""
    return [
        jsonable_encoder({k: v for k, v in err.items() if k in ("type", "loc", "msg", "ctx")})
        for err in exc.errors()
    ]


def _without_422(spec: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document without FastAPI's generated 422 answers: this API answers 400."""
    for methods in spec.get("paths", {}).values():
        for op in methods.values():
            if isinstance(op, dict):
                op.get("responses", {}).pop("422", None)
    schemas = spec.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return spec


def create_app(
    follower: ServedReplica,
    *,
    default_wait_ms: int = DEFAULT_WAIT_MS,
    max_wait_ms: int = MAX_WAIT_MS,
    max_pending_waits: int = DEFAULT_MAX_PENDING,
    generations: GenerationCache | None = None,
    load_timeout_ms: int = int(DEFAULT_LOAD_SECONDS * 1000),
) -> FastAPI:
    """The HTTP API over *follower*. The app does not start or close the follower: its owner
    (``statesnap serve``, a test, an embedding service) does.

    ``max_pending_waits`` bounds the requests waiting for freshness at once; beyond it a request
    that would wait answers 503 with ``Retry-After``. *generations* serves ``?generation=G``
    (without it such reads answer 400); its owner closes it. A read of a generation not yet
    loaded waits ``wait_ms`` or, without one, *load_timeout_ms* for the load.
    """
    app = FastAPI(
        docs_url=None,
        redoc_url=None,
        title=f"statesnap follower: {follower.name}",
        version=__version__,
        description=(__doc__ or "").split("\n\n", 1)[1],
        openapi_tags=[
            {"name": "table", "description": "Reads from the replica."},
            {"name": "operations", "description": "Health, status and metrics."},
        ],
    )
    waits = FreshnessWaits(follower, max_pending=max_pending_waits)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FollowerCollector(follower.status))
    app.add_middleware(_FreshnessHeaders, follower=follower)
    # Added last, so outermost: it times and counts every answer, errors included.
    app.add_middleware(MetricsMiddleware, metrics=HttpMetrics(registry, lambda: waits.pending))
    mount_docs(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
            )
            app.openapi_schema = _without_422(spec)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        body = {"detail": _validation_detail(exc), "errors": _validation_errors(exc)}
        return JSONResponse(body, status_code=400)

    @app.exception_handler(GenerationLoadTimeoutError)
    async def _load_timeout(_request: Request, exc: GenerationLoadTimeoutError) -> JSONResponse:
        body = {"detail": str(exc), "generation": exc.generation}
        return JSONResponse(body, status_code=504, headers={"Retry-After": "1"})

    @app.exception_handler(TableStateError)
    async def _not_ready(_request: Request, exc: TableStateError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(StatesnapError)
    async def _replica_failed(_request: Request, exc: StatesnapError) -> JSONResponse:
        # The background consumer failed while a request waited on it (broker lost, …).
        detail = f"replica failed: {type(exc).__name__}: {scrub(str(exc))}"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(ConfigError)
    async def _bad_request(_request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": scrub(str(exc))}, status_code=400)

    def require_table(table: str) -> None:
        if table != follower.name:
            raise HTTPException(404, f"no table {table!r} here; this server follows {follower.name!r}")

    def require_running() -> None:
        state = follower.state
        if state != "running":
            raise HTTPException(
                503, f"table {follower.name!r} is {state}, not ready for reads", headers={"Retry-After": "1"}
            )

    @contextlib.asynccontextmanager
    async def generation_read(generation: int, request: Request, timeout: float) -> AsyncIterator[Reads]:
        """Generation *generation*'s reader, loaded (or taken from the cache) for one answer."""
        if generations is None:
            raise HTTPException(400, "generation reads are off on this server (serve --max-generations 0)")
        try:
            async with generations.lease(generation, timeout) as reader:
                setattr(request.state, _FRESHNESS_KEY, SnapshotFreshness(generation, reader.offsets))
                yield reader
        except (GenerationNotFoundError, TableNotFoundError) as e:
            held = await anyio.to_thread.run_sync(_held, generations)
            detail = {"message": scrub(str(e)), "generation": generation, "generations": held}
            raise HTTPException(404, detail) from None
        except CheckpointError as e:  # does not verify: the error, never another generation
            detail = {
                "message": f"generation {generation} cannot be read: {type(e).__name__}: {scrub(str(e))}",
                "generation": generation,
            }
            raise HTTPException(500, detail) from None
        except (ConfigError, GenerationLoadTimeoutError):
            raise  # 400 / 504 by their handlers
        except StatesnapError as e:  # the store or the cluster unreachable a moment: retry
            why = f"{type(e).__name__}: {scrub(str(e))}"
            detail = {
                "message": f"generation {generation} could not be loaded: {why}",
                "generation": generation,
            }
            raise HTTPException(503, detail, headers={"Retry-After": "1"}) from None

    async def consistency(
        request: Request,
        table: str,
        generation: Annotated[
            int | None,
            Query(
                ge=0,
                description="Read as of this snapshot generation: exactly the state its checkpoint "
                "holds, never moving (X-Statesnap-Generation and X-Statesnap-Offsets say which). "
                "404 lists the generations there are; not with min_offsets or caught_up.",
            ),
        ] = None,
        min_offsets: Annotated[
            str | None,
            Query(
                description='Partition → offset of a record you wrote, as JSON ({"0": 123}) or as '
                "0:123,3:9; the answer waits until every such record is applied (read-your-writes).",
                examples=['{"0": 123}', "0:123"],
            ),
        ] = None,
        caught_up: Annotated[
            bool, Query(description="Wait until every partition is at end-of-partition.")
        ] = False,
        wait_ms: Annotated[
            int | None,
            Query(
                ge=0,
                le=max_wait_ms,
                description=f"How long to wait for min_offsets / caught_up (default {default_wait_ms}) "
                f"or for a generation to load (default {load_timeout_ms}); then 504.",
            ),
        ] = None,
    ) -> AsyncIterator[Reads]:
        """Table check, then what the answer reads: generation G's state, or the live replica
        once ready and as fresh as the caller demands; records what the answer will reflect for
        the headers."""
        require_table(table)
        if generation is not None:
            if min_offsets is not None or caught_up:
                raise HTTPException(
                    400,
                    f"generation {generation} is a snapshot: it does not move, so min_offsets and "
                    "caught_up do not go with generation",
                )
            timeout = (load_timeout_ms if wait_ms is None else wait_ms) / 1000
            async with generation_read(generation, request, timeout) as reader:
                yield reader
            return
        require_running()
        waited = default_wait_ms if wait_ms is None else wait_ms
        timeout = waited / 1000
        if min_offsets is not None:
            try:
                wanted = parse_min_offsets(min_offsets)
            except ParameterError as e:
                raise HTTPException(400, str(e)) from None
            if wanted and not await waits.offsets(wanted, timeout):
                raise HTTPException(
                    504,
                    {
                        "message": f"min_offsets not applied within {waited} ms",
                        "wanted": {str(p): o for p, o in wanted.items()},
                        "offsets": {str(p): o for p, o in follower.offsets.items()},
                    },
                )
        if caught_up and not await waits.caught_up(timeout):
            raise HTTPException(504, f"not caught up within {waited} ms")
        setattr(request.state, _FRESHNESS_KEY, Freshness.of(follower))
        yield follower

    errors: dict[int | str, dict[str, Any]] = {
        400: {
            "model": Problem,
            "description": "Malformed or out-of-range parameter (e.g. min_offsets, limit).",
        },
        404: {
            "model": Problem,
            "description": "No such table on this server, no such key, or no such generation (the "
            "answer lists the generations there are).",
        },
        500: {"model": Problem, "description": "The generation asked for does not verify (corrupt)."},
        503: {
            "model": Problem,
            "description": "The replica is still restoring (or failed), too many requests wait, or a "
            "generation could not be loaded for now (store or cluster unreachable).",
        },
        504: {
            "model": Problem,
            "description": "min_offsets / caught_up not reached, or the generation not loaded, within "
            "wait_ms.",
        },
    }

    @app.get(
        "/tables/{table}/keys",
        tags=["table"],
        summary="Scan keys in order, one page at a time",
        description="Up to `limit` rows with keys greater than `after` (or `after_b64`) and, with "
        "`prefix` (or `prefix_b64`), starting with it; ascending by key bytes. Keys and values are "
        "UTF-8 text, or base64 in `key_b64`/`value_b64` when they are not valid UTF-8. Follow `next` "
        "for the next page; it is null on the last page. A page costs O(limit) reads on stores with "
        "ordered reads. Each page is a separate read: rows may change between pages while the "
        "replica tails.",
        response_model=ScanPage,
        responses=errors,
    )
    async def scan_keys(
        reads: Annotated[Reads, Depends(consistency)],
        request: Request,
        table: str,
        after: Annotated[str | None, Query(description="Start after this key (UTF-8).")] = None,
        after_b64: Annotated[str | None, Query(description="Start after this key (base64).")] = None,
        prefix: Annotated[str | None, Query(description="Only keys starting with this (UTF-8).")] = None,
        prefix_b64: Annotated[str | None, Query(description="Only keys starting with this (base64).")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Rows per page.")] = DEFAULT_LIMIT,
    ) -> JSONResponse:
        start = _one_of(after, after_b64, "after")
        wanted = _one_of(prefix, prefix_b64, "prefix")
        rows, more = await anyio.to_thread.run_sync(lambda: _page(reads, start, wanted, limit))
        items = [{**_text_or_b64("key", k), **_text_or_b64("value", v)} for k, v in rows]
        next_url = None
        if more and rows:
            query: dict[str, Any] = _text_or_b64("after", rows[-1][0])
            if wanted:
                query.update(_text_or_b64("prefix", wanted))
            query["limit"] = limit
            snap = getattr(request.state, _FRESHNESS_KEY, None)
            if isinstance(snap, SnapshotFreshness):  # the next page of the same generation
                query["generation"] = snap.generation
            next_url = f"/tables/{table}/keys?{urlencode(query)}"
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
        reads: Annotated[Reads, Depends(consistency)], request: Request, table: str, key: str
    ) -> Response:
        raw_key = _path_key(request, key)
        value = reads.get_raw(raw_key)
        if value is None:
            detail = "key not found"
            if not reads.keeps(raw_key):
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
        description="The replica's keys, per-partition offsets and lag, restore seconds, checkpoint "
        "generation used and last update age; the server's request counts and latency histograms "
        "by route and status; requests in progress and waiting. Prometheus text format.",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format 0.0.4."}},
    )
    async def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE)

    return app
