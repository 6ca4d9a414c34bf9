"""The manifest: the small JSON document that makes a checkpoint exist (format version 1)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statesnap.checkpoint.manifest import (
    FORMAT_VERSION,
    CheckpointManifest,
    CheckpointState,
    DataFile,
    PartitionCheckpoint,
)
from statesnap.errors import CorruptCheckpointError

from .conftest import T0, make_manifest

BASE = DataFile("data/00000000000000000001/p00000-base-0.parquet", "base", 3, 1200, "a" * 64)
DELTA = DataFile("data/00000000000000000002/p00000-delta-0.parquet", "delta", 1, 400, "b" * 64)


def test_round_trip_keeps_every_field() -> None:
    m = make_manifest(7, files={0: (BASE, DELTA)}, offsets={0: 11, 3: 0})
    back = CheckpointManifest.from_bytes(m.to_bytes())
    assert back == m
    assert back.offsets == {0: 11, 3: 0}
    assert back.files == [BASE, DELTA]
    assert back.total_rows == 4
    assert back.total_bytes == 1600


def test_json_is_the_documented_layout() -> None:
    obj = json.loads(make_manifest(3, files={0: (BASE,)}).to_bytes())
    assert obj["format_version"] == FORMAT_VERSION == 1
    assert {
        "table",
        "topic",
        "cluster_id",
        "generation",
        "state",
        "created_at",
        "writer",
        "partitions",
    } <= set(obj)
    assert obj["partitions"]["0"] == {"next_offset": 10, "files": [BASE.to_json()]}
    assert obj["created_at"].endswith("+00:00")


_files = st.lists(
    st.builds(
        DataFile,
        path=st.from_regex(r"data/[0-9]{20}/p[0-9]{5}-(base|delta)-[0-9]\.parquet", fullmatch=True),
        kind=st.just("delta"),
        rows=st.integers(0, 10**9),
        bytes=st.integers(0, 10**12),
        sha256=st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    ),
    max_size=3,
)


@given(
    generation=st.integers(0, 10**15),
    partitions=st.dictionaries(st.integers(0, 10_000), st.tuples(st.integers(0, 2**62), _files), max_size=5),
    millis=st.integers(0, 4_000_000_000_000),
    state=st.sampled_from(CheckpointState),
    table=st.text(min_size=1, max_size=20),
)
def test_round_trip_property(
    generation: int,
    partitions: dict[int, tuple[int, list[DataFile]]],
    millis: int,
    state: CheckpointState,
    table: str,
) -> None:
    created = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
    m = CheckpointManifest(
        table=table,
        topic="t",
        cluster_id="c",
        generation=generation,
        partitions={p: PartitionCheckpoint(p, off, tuple(fs)) for p, (off, fs) in partitions.items()},
        created_at=created,
        state=state,
    )
    assert CheckpointManifest.from_bytes(m.to_bytes()) == m


def test_created_at_from_another_timezone_is_normalized_to_utc() -> None:
    m = make_manifest()
    obj = json.loads(m.to_bytes())
    obj["created_at"] = "2024-05-01T14:00:00.000+02:00"
    back = CheckpointManifest.from_bytes(json.dumps(obj).encode())
    assert back.created_at == T0
    obj["created_at"] = "2024-05-01T12:00:00"  # naive: read as UTC
    assert CheckpointManifest.from_bytes(json.dumps(obj).encode()).created_at == T0


def _mutated(**changes: object) -> bytes:
    obj = json.loads(make_manifest(files={0: (BASE,)}).to_bytes())
    for key, value in changes.items():
        if value is _DELETE:
            del obj[key]
        else:
            obj[key] = value
    return json.dumps(obj).encode()


_DELETE = object()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (make_manifest().to_bytes()[:40], "not valid JSON"),
        (make_manifest().to_bytes()[:-3], "not valid JSON"),
        (b"", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"[1, 2, 3]", "not a JSON object"),
        (_mutated(format_version=2), "unknown format version 2"),
        (_mutated(format_version=0), "unknown format version 0"),
        (_mutated(format_version="1"), "unknown format version '1'"),
        (_mutated(format_version=_DELETE), "unknown format version None"),
        (_mutated(topic=_DELETE), "malformed"),
        (_mutated(partitions=_DELETE), "malformed"),
        (_mutated(partitions=[1, 2]), "malformed"),
        (_mutated(partitions={"zero": {"next_offset": 1, "files": []}}), "malformed"),
        (_mutated(partitions={"0": {"files": []}}), "malformed"),
        (_mutated(partitions={"0": {"next_offset": -1, "files": []}}), "negative offset"),
        (_mutated(partitions={"0": {"next_offset": 1, "files": [{"path": "x"}]}}), "malformed"),
        (
            _mutated(partitions={"0": {"next_offset": 1, "files": [{**BASE.to_json(), "kind": "full"}]}}),
            "malformed",
        ),
        (_mutated(created_at="yesterday"), "malformed"),
        (_mutated(state="HALF_DONE"), "malformed"),
        (_mutated(generation="seven"), "malformed"),
    ],
)
def test_corrupt_manifests_raise_corrupt_checkpoint_error(data: bytes, match: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=match) as info:
        CheckpointManifest.from_bytes(data, source="s3://b/t/snapshots/1.json")
    assert "s3://b/t/snapshots/1.json" in str(info.value)  # names the thing that is wrong


def test_unknown_format_version_is_refused_even_if_otherwise_well_formed() -> None:
    """A future writer's format must not be misread by this reader: skip, don't guess."""
    with pytest.raises(CorruptCheckpointError, match=r"reads \[1\]"):
        CheckpointManifest.from_bytes(_mutated(format_version=FORMAT_VERSION + 1))


@pytest.mark.parametrize(
    "files",
    [
        [DELTA.to_json(), BASE.to_json()],
        [BASE.to_json(), DELTA.to_json(), BASE.to_json()],
        [DELTA.to_json(), DELTA.to_json(), BASE.to_json()],
    ],
)
def test_base_after_delta_is_corrupt(files: list[dict[str, object]]) -> None:
    """Merge-on-read applies a base first; a base after a delta would silently drop the delta."""
    data = _mutated(partitions={"0": {"next_offset": 5, "files": files}})
    with pytest.raises(CorruptCheckpointError, match="base file after a delta"):
        CheckpointManifest.from_bytes(data)


def test_delta_only_and_base_then_deltas_are_valid() -> None:
    for files in ([DELTA.to_json()], [BASE.to_json(), DELTA.to_json(), DELTA.to_json()], []):
        data = _mutated(partitions={"0": {"next_offset": 5, "files": files}})
        assert CheckpointManifest.from_bytes(data).partitions[0].next_offset == 5


def test_age_uses_the_injected_clock() -> None:
    m = make_manifest(created_at=T0)
    assert m.age_seconds(T0 + timedelta(minutes=2)) == 120
