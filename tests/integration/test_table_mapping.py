"""Table and Follower as typed ``Mapping``s on the real broker: iteration in key order, views,
``get``/``in``/``len``, range scans by prefix and after a key, on every state store, restored from a
checkpoint plus a tail; and (issue 11) a value the serde cannot decode raises a typed error naming
key, partition and offset instead of a bare ``JSONDecodeError``.

Ground truth is the KTable computed from the records the broker acknowledged
(tests/integration/conftest.py), decoded with the standard library, not with statesnap's serdes.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from pathlib import Path
from typing import Any

import pytest

from statesnap import Follower, RowFilter, StoreOptions, Table
from statesnap.errors import (
    ConfigError,
    DeserializationError,
    StatesnapError,
    TableStateError,
    UndecodableRowError,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
STORES = ["memory", "rocksdb", "columnar"]


def records(rng: random.Random, n: int) -> list[tuple[int, bytes, bytes | None]]:
    out: list[tuple[int, bytes, bytes | None]] = []
    for i in range(n):
        key = f"{rng.choice(['eu', 'us', 'asia'])}-{rng.randrange(40):02d}".encode()
        value = None if rng.random() < 0.1 else json.dumps({"n": i, "k": key.decode()}).encode()
        out.append((sum(key) % PARTITIONS, key, value))
    return out


def decoded(truth: dict[bytes, bytes]) -> list[tuple[str, Any]]:
    return [(k.decode(), json.loads(v)) for k, v in sorted(truth.items())]


@pytest.mark.parametrize("store", STORES)
def test_table_is_an_ordered_typed_mapping(kafka: Any, tmp_path: Path, store: str) -> None:
    rng = random.Random(3)
    topic = kafka.create_topic(f"map-{uuid.uuid4().hex[:12]}", PARTITIONS)
    url = (tmp_path / "cp").as_uri()
    produced = kafka.produce(topic, records(rng, 400))
    with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False):
        pass  # writes a checkpoint on close, so the next table restores rows from data files
    produced += kafka.produce(topic, records(rng, 200))  # and replays these on top
    expected = decoded(kafka.truth(produced))

    t: Table[str, Any] = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=url,
        store=StoreOptions(store, path=tmp_path / "db"),
        key_serde="string",
        value_serde="json",
        background=False,
    )
    report = t.start()
    try:
        assert report.checkpoint == 1
        assert report.replayed_records == 200
        assert isinstance(t, Mapping)
        assert list(t) == [k for k, _ in expected]
        assert isinstance(t.keys(), KeysView)
        assert isinstance(t.values(), ValuesView)
        assert isinstance(t.items(), ItemsView)
        assert list(t.keys()) == [k for k, _ in expected]
        assert list(t.values()) == [v for _, v in expected]
        assert list(t.items()) == expected
        assert dict(t) == dict(expected)
        assert len(t) == len(expected) == len(t.keys())
        first_key, first_value = expected[0]
        assert first_key in t
        assert first_key in t.keys()  # noqa: SIM118 - the view's own __contains__
        assert (first_key, first_value) in t.items()
        assert first_value in t.values()
        assert "nope" not in t
        assert t.get("nope") is None
        assert t.get("nope", 5) == 5
        assert t[first_key] == first_value
        with pytest.raises(KeyError):
            t["nope"]

        # Pages of 7 walk the whole table in key order, without gaps or repeats.
        pages, after = [], None
        while page := t.scan(after=after, limit=7):
            assert len(page) <= 7
            pages.extend(page)
            after = page[-1][0]
        assert pages == expected
        eu = [(k, v) for k, v in expected if k.startswith("eu-")]
        assert t.scan(prefix="eu-") == eu
        assert t.scan(prefix=b"eu-", limit=3) == eu[:3]
        assert t.scan(prefix="eu-", after=eu[2][0]) == eu[3:]
        assert t.scan(after="zzz") == []
        raw = sorted(kafka.truth(produced).items())
        assert t.raw_scan(limit=5) == raw[:5]
        assert t.raw_scan(prefix=b"us-") == [kv for kv in raw if kv[0].startswith(b"us-")]
        with pytest.raises(ConfigError, match="limit"):
            t.scan(limit=0)

        # A live table equals itself only (comparing contents would read two whole tables).
        assert t == t  # noqa: PLR0124
        assert t != dict(expected)
        assert hash(t) == hash(t)
    finally:
        t.close(checkpoint=False)
    with pytest.raises(TableStateError):
        list(t)


def test_follower_is_the_same_mapping(kafka: Any, tmp_path: Path) -> None:
    rng = random.Random(5)
    topic = kafka.create_topic(f"fmap-{uuid.uuid4().hex[:12]}", PARTITIONS)
    produced = kafka.produce(topic, records(rng, 300))
    expected = decoded(kafka.truth(produced))
    f: Follower[str, Any] = Follower(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=None,
        key_serde="string",
        value_serde="json",
        row_filter=RowFilter(key_filter=lambda k: not k.startswith(b"asia-")),
    )
    with pytest.raises(TableStateError, match="new"):
        list(f)
    with f:
        kept = [(k, v) for k, v in expected if not k.startswith("asia-")]
        assert isinstance(f, Mapping)
        assert list(f.items()) == kept
        assert list(f) == [k for k, _ in kept]
        assert list(f.values()) == [v for _, v in kept]
        assert len(f) == len(kept)
        assert f.get(kept[0][0]) == kept[0][1]
        assert f.scan(prefix="us-", limit=4) == [(k, v) for k, v in kept if k.startswith("us-")][:4]
        assert f.scan(prefix="asia-") == []
        raw = sorted((k, v) for k, v in kafka.truth(produced).items() if not k.startswith(b"asia-"))
        assert f.raw_scan(limit=3) == raw[:3]
        assert f.get_raw(raw[0][0]) == raw[0][1]


class Strict:
    """A custom serde that raises a plain exception, as users' serdes do."""

    def serialize(self, obj: Any) -> bytes:
        return str(obj).encode()

    def deserialize(self, data: bytes) -> Any:
        if not data.startswith(b"ok:"):
            raise ValueError("missing the ok: marker")
        return data[3:].decode()


@pytest.mark.parametrize("store", ["memory", "rocksdb"])
@pytest.mark.parametrize("restored", [False, True], ids=["replayed", "from-checkpoint"])
def test_undecodable_value_names_key_partition_and_offset(
    kafka: Any, tmp_path: Path, store: str, restored: bool
) -> None:
    """Issue 11: ``get()`` and ``items()`` raised a bare JSONDecodeError naming nothing."""
    topic = kafka.create_topic(f"bad-{uuid.uuid4().hex[:12]}", PARTITIONS)
    produced = kafka.produce(
        topic,
        [
            (0, b"a", b'{"x":1}'),
            (1, b"b", b'{"x":2}'),
            (2, b"c", b'{"x":3}'),
            (1, b"bad", b"\x00not json SECRET-VALUE"),
            (2, b"d", b'{"x":4}'),
        ],
    )
    bad = next(r for r in produced if r.key == b"bad")
    url = (tmp_path / "cp").as_uri() if restored else None
    if restored:
        with Table(topic, bootstrap_servers=kafka.bootstrap, checkpoints=url, background=False):
            pass
    t = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=url,
        store=StoreOptions(store, path=tmp_path / "db"),
        key_serde="string",
        value_serde="json",
        background=False,
    )
    report = t.start()
    try:
        assert report.replayed_records == (0 if restored else 5)
        assert t.get("a") == {"x": 1}
        for read in (
            lambda: t.get("bad"),
            lambda: t["bad"],
            lambda: list(t.items()),
            lambda: list(t.values()),
        ):
            with pytest.raises(UndecodableRowError) as caught:
                read()
            err = caught.value
            assert isinstance(err, DeserializationError)
            assert isinstance(err, StatesnapError)
            assert isinstance(err.__cause__, DeserializationError)  # the serde's own error, chained
            assert (err.key, err.partition, err.offset) == (b"bad", 1, bad.offset)
            text = str(err)
            assert "b'bad'" in text
            assert f"partition 1, offset {bad.offset}" in text
            assert repr(topic) in text or repr(t.name) in text
            assert "SECRET-VALUE" not in text
        assert dict(t.raw_items())[b"bad"].startswith(b"\x00not json")  # the bytes are untouched
    finally:
        t.close(checkpoint=False)

    custom = Table(topic, bootstrap_servers=kafka.bootstrap, value_serde=Strict(), background=False)
    custom.start()
    try:
        with pytest.raises(UndecodableRowError, match=r"b'a'.*partition 0, offset 0.*ok: marker") as caught:
            custom.get(b"a")
        assert isinstance(caught.value.__cause__, ValueError)
    finally:
        custom.close(checkpoint=False)
