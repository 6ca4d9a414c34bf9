"""The follower façade and its HTTP layer without services: typed errors before any I/O, the
status value, the Prometheus rendering, and the API's parsing and status codes against a fake
replica (FastAPI's in-process test client)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from fastapi.testclient import TestClient

from statesnap import RowFilter
from statesnap.cli.serve import prefix_filter
from statesnap.errors import BrokerUnavailableError, ConfigError, ReadOnlyTableError, TableStateError
from statesnap.python.follower import Follower, FollowerStatus
from statesnap.serve import Freshness, create_app, render_metrics


def make_status(**overrides: Any) -> FollowerStatus:
    fields: dict[str, Any] = {
        "table": "orders",
        "topic": "orders-log",
        "state": "running",
        "caught_up": False,
        "offsets": MappingProxyType({0: 10, 1: 7}),
        "lag": MappingProxyType({0: 0, 1: 3}),
        "keys": 12,
        "checkpoint_generation": 4,
        "restore_seconds": 1.23456,
        "replayed_records": 99,
        "last_update_age": 0.5,
        "newest_record_age": 2.0,
    }
    fields.update(overrides)
    return FollowerStatus(**fields)


# --- the façade before any I/O -------------------------------------------------------------------


def test_a_follower_refuses_writes_and_reads_before_start() -> None:
    f = Follower("orders", bootstrap_servers="127.0.0.1:1", checkpoints=None)
    assert f.state == "new"
    with pytest.raises(ReadOnlyTableError, match="read-only"):
        f.checkpoint()
    with pytest.raises(ReadOnlyTableError, match="orders"):
        f.put(b"k", b"v")
    with pytest.raises(ReadOnlyTableError):
        f[b"k"] = b"v"
    with pytest.raises(ReadOnlyTableError):
        del f[b"k"]
    with pytest.raises(TableStateError, match="cannot get: table is new"):
        f.get(b"k")
    with pytest.raises(TableStateError):
        f.wait_for({0: 1}, timeout=0.1)
    with pytest.raises(TableStateError):
        f.scan()
    with pytest.raises(ConfigError, match="limit"):
        f.scan(limit=0)
    status = f.status()
    assert status.state == "new"
    assert not status.ready
    assert status.keys == 0
    assert dict(status.offsets) == {}
    assert status.checkpoint_generation is None
    assert f.keeps(b"anything")
    f.close()
    assert f.state == "closed"
    with pytest.raises(TableStateError, match="closed"):
        f.start()


def test_cli_wait_limits_match_the_api() -> None:
    import statesnap.cli.serve as cli_serve
    from statesnap.serve import app

    assert (cli_serve.MAX_WAIT_MS, cli_serve.DEFAULT_WAIT_MS) == (app.MAX_WAIT_MS, app.DEFAULT_WAIT_MS)


def test_key_filter_decides_what_the_replica_keeps() -> None:
    f = Follower(
        "orders",
        bootstrap_servers="127.0.0.1:1",
        checkpoints=None,
        row_filter=RowFilter(key_filter=prefix_filter(("eu-", "us-"))),
    )
    assert f.keeps(b"eu-1")
    assert f.keeps(b"us-")
    assert not f.keeps(b"asia-1")
    assert prefix_filter(()) is None
    f.close()


def test_status_value() -> None:
    s = make_status()
    assert s.ready
    assert s.total_lag == 3
    doc = s.to_json()
    assert doc["offsets"] == {"0": 10, "1": 7}
    assert doc["restore_seconds"] == 1.235
    assert doc["total_lag"] == 3
    assert json.loads(json.dumps(doc)) == doc
    with pytest.raises(AttributeError):
        s.keys = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.offsets[0] = 1  # type: ignore[index]
    assert not make_status(state="restoring").ready


# --- metrics -----------------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text as {(name, labels): value}, independent of label order and number format."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        labels = frozenset(tuple(kv.split("=", 1)) for kv in rest.rstrip("}").split('",') if kv)
        out[name, frozenset((k, v.strip('"')) for k, v in labels)] = float(value)
    return out


def test_metrics_text_format() -> None:
    text = render_metrics(make_status(table="we-ird"))
    assert text.endswith("\n")
    assert "# TYPE statesnap_follower_lag_records gauge" in text.splitlines()
    got = samples(text)
    base = {("table", "we-ird"), ("topic", "orders-log")}

    def value(name: str, **labels: str) -> float:
        return got[name, frozenset(base | set(labels.items()))]

    assert value("statesnap_follower_keys") == 12
    assert value("statesnap_follower_up") == 1
    assert value("statesnap_follower_caught_up") == 0
    assert value("statesnap_follower_lag_records", partition="1") == 3
    assert value("statesnap_follower_offset", partition="0") == 10
    assert value("statesnap_follower_checkpoint_generation") == 4
    assert value("statesnap_follower_restore_seconds") == 1.23456
    assert value("statesnap_follower_last_update_age_seconds") == 0.5
    assert 'table="we\\"ird"' in render_metrics(make_status(table='we"ird'))  # label values escaped

    booting = render_metrics(
        make_status(
            state="restoring",
            checkpoint_generation=None,
            restore_seconds=None,
            last_update_age=None,
            newest_record_age=None,
        )
    )
    got = samples(booting)
    base = {("table", "orders"), ("topic", "orders-log")}
    assert value("statesnap_follower_checkpoint_generation") == 0
    assert "restore_seconds" not in booting
    assert "age_seconds" not in booting
    assert value("statesnap_follower_up") == 0


# --- the HTTP layer against a fake replica -------------------------------------------------------


class FakeFollower:
    """The part of Follower the app uses, with a dict for a table."""

    name = "orders"
    topic = "orders-log"

    def __init__(self, rows: Mapping[bytes, bytes]) -> None:
        self.rows = dict(rows)
        self.state = "running"
        self.offsets = {0: 5, 1: 9}
        self.caught_up = True
        self.waits: list[Any] = []
        self.wait_result = True

    def lag(self) -> dict[int, int]:
        return {0: 0, 1: 2}

    def newest_record_age(self) -> float | None:
        return 1.5

    def keeps(self, key: bytes) -> bool:
        return not key.startswith(b"hidden")

    def get_raw(self, key: bytes) -> bytes | None:
        return self.rows.get(key)

    def scan(self, after: bytes | None = None, limit: int = 100) -> list[tuple[bytes, bytes]]:
        return sorted((k, v) for k, v in self.rows.items() if after is None or k > after)[:limit]

    def wait_for(self, offsets: Mapping[int, int], *, timeout: float) -> bool:
        if any(p not in self.offsets for p in offsets):
            raise ConfigError(f"does not follow partitions {sorted(offsets)}")
        self.waits.append((dict(offsets), timeout))
        return self.wait_result

    def wait_caught_up(self, timeout: float) -> bool:
        self.waits.append(("caught_up", timeout))
        return self.wait_result

    def status(self) -> FollowerStatus:
        return make_status(state=self.state, caught_up=self.caught_up, keys=len(self.rows))


@pytest.fixture
def fake() -> FakeFollower:
    return FakeFollower({b"a": b"1", b"b/c": b"\xff\x00", b"\xfe\x01": b"bin", b"z": b"last"})


@pytest.fixture
def client(fake: FakeFollower) -> TestClient:
    return TestClient(create_app(fake, default_wait_ms=1000, max_wait_ms=2000))


def test_lookup_raw_bytes_and_headers(client: TestClient, fake: FakeFollower) -> None:
    r = client.get("/tables/orders/keys/a")
    assert r.status_code == 200
    assert r.content == b"1"
    assert r.headers["content-type"] == "application/octet-stream"
    assert json.loads(r.headers["x-statesnap-offsets"]) == {"0": 5, "1": 9}
    assert r.headers["x-statesnap-lag"] == "2"
    assert r.headers["x-statesnap-caught-up"] == "true"
    assert r.headers["x-statesnap-newest-record-age"] == "1.500"
    assert r.headers["x-statesnap-state"] == "running"
    assert client.get("/tables/orders/keys/b%2Fc").content == b"\xff\x00"
    assert client.get("/tables/orders/keys/%FE%01").content == b"bin"
    missing = client.get("/tables/orders/keys/nope")
    assert missing.status_code == 404
    assert missing.json() == {"detail": "key not found"}
    assert "x-statesnap-offsets" in missing.headers
    assert "filter" in client.get("/tables/orders/keys/hidden-1").json()["detail"]
    assert client.get("/tables/other/keys/a").status_code == 404


def test_consistency_parameters(client: TestClient, fake: FakeFollower) -> None:
    r = client.get("/tables/orders/keys/a", params={"min_offsets": '{"1": 8}', "wait_ms": 1500})
    assert r.status_code == 200
    assert fake.waits == [({1: 8}, 0)]  # a first check; the API itself waits up to wait_ms
    r = client.get("/tables/orders/keys/a", params={"caught_up": "true"})
    assert r.status_code == 200
    assert fake.waits[-1] == ("caught_up", 0)
    fake.wait_result = False
    r = client.get("/tables/orders/keys/a", params={"min_offsets": '{"0": 99}', "wait_ms": 10})
    assert r.status_code == 504
    assert r.json()["detail"]["wanted"] == {"0": 99}
    assert r.json()["detail"]["offsets"] == {"0": 5, "1": 9}
    fake.caught_up = False  # the API samples the replica itself while it waits
    assert client.get("/tables/orders/keys/a", params={"caught_up": "true", "wait_ms": 50}).status_code == 504
    for bad in ("[]", "{", '{"a": 1}', '{"0": -1}', '"x"'):
        r = client.get("/tables/orders/keys/a", params={"min_offsets": bad})
        assert r.status_code == 400, bad
        assert "min_offsets" in r.text
    assert client.get("/tables/orders/keys/a", params={"min_offsets": '{"7": 1}'}).status_code == 400
    assert client.get("/tables/orders/keys/a", params={"wait_ms": 2001}).status_code == 400
    assert client.get("/tables/orders/keys/a", params={"min_offsets": "{}"}).status_code == 200


def test_a_replica_failing_during_a_wait_is_503(
    client: TestClient, fake: FakeFollower, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fails(offsets: Mapping[int, int], *, timeout: float) -> bool:
        raise BrokerUnavailableError("lost the Kafka cluster at 127.0.0.1:1")

    monkeypatch.setattr(fake, "wait_for", fails)
    r = client.get("/tables/orders/keys/a", params={"min_offsets": '{"0": 1}'})
    assert r.status_code == 503
    assert "BrokerUnavailableError" in r.json()["detail"]


def test_scan_pages(client: TestClient) -> None:
    r = client.get("/tables/orders/keys", params={"limit": 2})
    page = r.json()
    binary = base64.b64encode(b"\xff\x00").decode()
    assert page["items"] == [{"key": "a", "value": "1"}, {"key": "b/c", "value_b64": binary}]
    assert page["next"] == "/tables/orders/keys?after=b%2Fc&limit=2"
    page = client.get(page["next"]).json()
    assert page["items"] == [{"key": "z", "value": "last"}, {"key_b64": "/gE=", "value": "bin"}]
    assert page["next"] == "/tables/orders/keys?after_b64=%2FgE%3D&limit=2"
    page = client.get(page["next"]).json()
    assert page == {"table": "orders", "items": [], "next": None}
    assert client.get("/tables/orders/keys", params={"after": "a", "after_b64": "YQ=="}).status_code == 400
    assert client.get("/tables/orders/keys", params={"after_b64": "not base64!"}).status_code == 400
    assert client.get("/tables/orders/keys", params={"limit": 1001}).status_code == 400


def test_readiness_and_status(client: TestClient, fake: FakeFollower) -> None:
    assert client.get("/health").status_code == 200
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/tables/orders").json()["keys"] == 4
    fake.state = "restoring"
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json()["status"] == "restoring"
    r = client.get("/tables/orders/keys/a")
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.headers["x-statesnap-state"] == "restoring"
    assert client.get("/tables/orders/keys").status_code == 503
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics").headers["content-type"].startswith("text/plain; version=0.0.4")


def test_freshness_headers() -> None:
    h = dict(Freshness("running", {1: 4, 0: 2}, 0, True, None).headers())
    assert h[b"x-statesnap-offsets"] == b'{"0":2,"1":4}'
    assert b"x-statesnap-newest-record-age" not in h
