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
"""

# The docstring above, past its first paragraph, is the OpenAPI description users read: notes for
# developers (the package layout) live in serve/__init__.py.
# No ``from __future__ import annotations`` here: FastAPI reads the route signatures at runtime and
# they refer to names local to create_app().
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio.to_thread
from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry

from statesnap.serve.consistency import reads_dependency, require_table
from statesnap.serve.docs import mount_docs
from statesnap.serve.generations import DEFAULT_LOAD_SECONDS, GenerationCache
from statesnap.serve.headers import FreshnessHeaders, SnapshotFreshness, recorded
from statesnap.serve.metrics import CONTENT_TYPE, FollowerCollector, HttpMetrics, MetricsMiddleware, render
from statesnap.serve.models import ERROR_RESPONSES, HealthModel, ScanPage, StatusModel
from statesnap.serve.problems import answer_problems
from statesnap.serve.rows import Reads, one_of, page, path_key, text_or_b64
from statesnap.serve.waits import DEFAULT_MAX_PENDING, FreshnessWaits, ServedReplica
from statesnap.version import __version__

__all__ = ["DEFAULT_LIMIT", "DEFAULT_WAIT_MS", "MAX_LIMIT", "MAX_WAIT_MS", "create_app"]

#: Default and maximum time a request may wait for ``min_offsets`` / ``caught_up``.
DEFAULT_WAIT_MS = 5_000
MAX_WAIT_MS = 60_000
#: Page size bounds of the key scan.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000


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
    app.add_middleware(FreshnessHeaders, follower=follower)
    # Added last, so outermost: it times and counts every answer, errors included.
    app.add_middleware(MetricsMiddleware, metrics=HttpMetrics(registry, lambda: waits.pending))
    mount_docs(app)
    answer_problems(app)
    consistency = reads_dependency(
        follower,
        waits=waits,
        generations=generations,
        default_wait_ms=default_wait_ms,
        max_wait_ms=max_wait_ms,
        load_timeout_ms=load_timeout_ms,
    )

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
        responses=ERROR_RESPONSES,
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
        start = one_of(after, after_b64, "after")
        wanted = one_of(prefix, prefix_b64, "prefix")
        rows, more = await anyio.to_thread.run_sync(lambda: page(reads, start, wanted, limit))
        items = [{**text_or_b64("key", k), **text_or_b64("value", v)} for k, v in rows]
        next_url = None
        if more and rows:
            query: dict[str, Any] = text_or_b64("after", rows[-1][0])
            if wanted:
                query.update(text_or_b64("prefix", wanted))
            query["limit"] = limit
            snap = recorded(request)
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
            **ERROR_RESPONSES,
        },
    )
    async def get_key(
        reads: Annotated[Reads, Depends(consistency)], request: Request, table: str, key: str
    ) -> Response:
        raw_key = path_key(request, key)
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
        responses={404: ERROR_RESPONSES[404]},
    )
    async def table_status(table: str) -> JSONResponse:
        require_table(follower, table)
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
