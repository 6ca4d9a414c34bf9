"""``/metrics``: the follower's freshness gauges and the server's request metrics, through
prometheus_client, in the Prometheus text format (version 0.0.4, what every scraper reads).

Each app has its own registry (not prometheus_client's global one), so several servers, or a
service embedding one, never mix series. Series:

- ``statesnap_follower_*{table,topic[,partition]}``: gauges sampled from ``Follower.status()`` at
  scrape time (up, caught_up, keys, offset, lag_records, restore_seconds, checkpoint_generation,
  replayed_records, last_update_age_seconds, newest_record_age_seconds).
- ``statesnap_http_requests_total{method,handler,code}``: answered requests; ``handler`` is the
  route template (``/tables/{table}/keys/{key}``), never the raw path, so keys do not explode the
  label set.
- ``statesnap_http_request_duration_seconds{method,handler}``: latency histogram.
- ``statesnap_http_requests_in_progress`` and ``statesnap_http_pending_waits`` (requests waiting
  for ``min_offsets`` / ``caught_up``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from statesnap.python.follower import FollowerStatus
from statesnap.serve.asgi import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "FollowerCollector",
    "HttpMetrics",
    "MetricsMiddleware",
    "render",
    "render_metrics",
]

#: The media type Prometheus scrapers expect for the text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Latency buckets (seconds): lookups take well under a millisecond; waits last up to wait_ms.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class FollowerCollector(Collector):
    """Gauges of one follower, read from *status* at every scrape.

    ``statesnap_follower_checkpoint_generation`` is 0 after a full replay (generations start at 1);
    age and restore gauges are absent until they have a value.
    """

    def __init__(self, status: Callable[[], FollowerStatus]) -> None:
        self.status = status

    def describe(self) -> list[Metric]:
        return []  # no sampling at registration time; names are fixed and unique

    def collect(self) -> Iterator[Metric]:
        s = self.status()
        names = ["table", "topic"]
        base = [s.table, s.topic]

        def gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
            if value is not None:
                g = GaugeMetricFamily(name, doc, labels=names)
                g.add_metric(base, value)
                yield g

        def per_partition(name: str, doc: str, values: dict[int, int]) -> Iterator[Metric]:
            g = GaugeMetricFamily(name, doc, labels=[*names, "partition"])
            for p, v in sorted(values.items()):
                g.add_metric([*base, str(p)], v)
            yield g

        yield from gauge(
            "statesnap_follower_up", "1 when the replica is restored and tailing (ready).", s.ready
        )
        yield from gauge(
            "statesnap_follower_caught_up", "1 when every partition is at end-of-partition.", s.caught_up
        )
        yield from gauge("statesnap_follower_keys", "Keys held by the replica.", s.keys)
        yield from per_partition(
            "statesnap_follower_offset",
            "Next offset to consume per partition (every record below it is applied).",
            dict(s.offsets),
        )
        yield from per_partition(
            "statesnap_follower_lag_records",
            "Records behind per partition (0 at end-of-partition, else an estimate from the high watermark).",
            dict(s.lag),
        )
        yield from gauge(
            "statesnap_follower_restore_seconds",
            "Seconds the boot took (checkpoint load plus tail replay).",
            s.restore_seconds,
        )
        yield from gauge(
            "statesnap_follower_checkpoint_generation",
            "Checkpoint generation the replica booted from (0: full replay).",
            s.checkpoint_generation or 0,
        )
        yield from gauge(
            "statesnap_follower_replayed_records",
            "Changelog records replayed during the boot.",
            s.replayed_records,
        )
        yield from gauge(
            "statesnap_follower_last_update_age_seconds",
            "Seconds since the replica last applied a changelog record.",
            s.last_update_age,
        )
        yield from gauge(
            "statesnap_follower_newest_record_age_seconds",
            "Seconds since the timestamp of the newest record applied.",
            s.newest_record_age,
        )


def render(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format."""
    return generate_latest(registry)


def render_metrics(status: FollowerStatus) -> str:
    """The follower gauges of one status value, as text (for tests and embedding)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FollowerCollector(lambda: status))
    return render(registry).decode()


class HttpMetrics:
    """Request counters, latency histogram and in-flight gauges, registered in *registry*."""

    def __init__(self, registry: CollectorRegistry, pending_waits: Callable[[], int]) -> None:
        self.requests = Counter(
            "statesnap_http_requests",
            "HTTP requests answered, by route template and status code.",
            ["method", "handler", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "statesnap_http_request_duration_seconds",
            "Time from request to the end of the answer, waits included.",
            ["method", "handler"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_progress = Gauge(
            "statesnap_http_requests_in_progress", "Requests being answered.", registry=registry
        )
        waits = Gauge(
            "statesnap_http_pending_waits",
            "Requests waiting for min_offsets / caught_up.",
            registry=registry,
        )
        waits.set_function(lambda: float(pending_waits()))


def _handler_of(scope: Scope) -> str:
    """The route template the router matched (FastAPI puts the route in the scope); requests that
    matched nothing share one label, so random paths cannot grow the series without bound."""
    route = scope.get("route")
    path = getattr(route, "path", None) or getattr(route, "path_format", None)
    if isinstance(path, str):
        return path.replace("{key:path}", "{key}")
    if scope.get("endpoint") is not None:  # a Mount (the docs assets): its prefix
        return str(scope.get("root_path", "")) or "unmatched"
    return "unmatched"


class MetricsMiddleware:
    """Pure ASGI middleware counting and timing every HTTP request (outermost, so it sees errors
    answered by exception handlers too)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        self.metrics.in_progress.inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.in_progress.dec()
            method = str(scope.get("method", ""))
            handler = _handler_of(scope)
            self.metrics.requests.labels(method, handler, str(status["code"])).inc()
            self.metrics.latency.labels(method, handler).observe(time.perf_counter() - started)
