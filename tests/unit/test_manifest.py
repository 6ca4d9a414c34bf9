"""The manifest: the small JSON document that makes a checkpoint exist (format version 2: it carries
its own checksum; version 1 is still read)."""

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
    FileKind,
    PartitionCheckpoint,
    canonical_checksum,
)
from statesnap.errors import CorruptCheckpointError

from .conftest import T0, make_manifest

BASE = DataFile("data/00000000000000000001/p00000-base-0.parquet", FileKind.BASE, 3, 1200, "a" * 64)
DELTA = DataFile("data/00000000000000000002/p00000-delta-0.parquet", FileKind.DELTA, 1, 400, "b" * 64)
DELTA2 = DataFile("data/00000000000000000002/p00000-delta-1.parquet", FileKind.DELTA, 1, 400, "c" * 64)


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
    assert obj["format_version"] == FORMAT_VERSION == 2
    assert obj["checksum"] == canonical_checksum(obj)
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


def _delta(partition: int, generation: int, n: int, rows: int, size: int, sha: str) -> DataFile:
    return DataFile(
        f"data/{generation:020d}/p{partition:05d}-delta-{n}.parquet", FileKind.DELTA, rows, size, sha
    )


_file_names = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 99)), max_size=3, unique=True)


@given(
    generation=st.integers(10**6, 10**15),
    partitions=st.dictionaries(
        st.integers(0, 10_000), st.tuples(st.integers(0, 2**62), _file_names), max_size=5
    ),
    millis=st.integers(0, 4_000_000_000_000),
    state=st.sampled_from(CheckpointState),
    table=st.text(min_size=1, max_size=20),
    size=st.integers(1, 10**12),
    sha=st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
)
def test_round_trip_property(
    generation: int,
    partitions: dict[int, tuple[int, list[tuple[int, int]]]],
    millis: int,
    state: CheckpointState,
    table: str,
    size: int,
    sha: str,
) -> None:
    created = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
    m = CheckpointManifest(
        table=table,
        topic="t",
        cluster_id="c",
        generation=generation,
        partitions={
            p: PartitionCheckpoint(
                p, off if names else 0, tuple(_delta(p, g, n, 1, size, sha) for g, n in sorted(names))
            )
            for p, (off, names) in partitions.items()
        },
        created_at=created,
        state=state,
    )
    assert CheckpointManifest.from_bytes(m.to_bytes()) == m


def test_created_at_from_another_timezone_is_normalized_to_utc() -> None:
    m = make_manifest(offsets={0: 0})
    obj = json.loads(m.to_bytes())
    obj["created_at"] = "2024-05-01T14:00:00.000+02:00"
    obj["checksum"] = canonical_checksum(obj)  # as another writer would have signed it
    back = CheckpointManifest.from_bytes(json.dumps(obj).encode())
    assert back.created_at == T0
    obj["created_at"] = "2024-05-01T12:00:00"  # naive: read as UTC
    obj["checksum"] = canonical_checksum(obj)
    assert CheckpointManifest.from_bytes(json.dumps(obj).encode()).created_at == T0


def _mutated(*, sign: bool = True, **changes: object) -> bytes:
    """The test manifest with *changes*, re-signed (so the checks behind the checksum are what is
    tested) unless *sign* is false."""
    obj = json.loads(make_manifest(2, files={0: (BASE,)}, offsets={0: 10}).to_bytes())
    for key, value in changes.items():
        if value is _DELETE:
            del obj[key]
        else:
            obj[key] = value
    if sign:
        obj["checksum"] = canonical_checksum(obj)
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
        (_mutated(format_version=3), "unknown format version 3"),
        (_mutated(format_version=0), "unknown format version 0"),
        (_mutated(format_version="1"), "unknown format version '1'"),
        (_mutated(format_version=True), "unknown format version True"),
        # Unhashable values: the set lookup raised TypeError (found by the fault suite's fuzz).
        (_mutated(format_version=[]), r"unknown format version \[\]"),
        (_mutated(format_version={"a": 1}), "unknown format version {'a': 1}"),
        (_mutated(format_version=_DELETE), "unknown format version None"),
        (_mutated(topic=_DELETE), "topic is null"),
        (_mutated(partitions=_DELETE), "partitions is null"),
        (_mutated(partitions=[1, 2]), "partitions is a JSON array"),
        (_mutated(partitions={"zero": {"next_offset": 1, "files": []}}), "not a partition number"),
        (_mutated(partitions={"0": {"files": []}}), "next_offset is null"),
        (_mutated(partitions={"0": {"next_offset": -1, "files": []}}), r"next_offset is -1, outside"),
        (_mutated(partitions={"0": {"next_offset": 1, "files": [{"path": "x"}]}}), "not under data/"),
        (
            _mutated(partitions={"0": {"next_offset": 1, "files": [{**BASE.to_json(), "kind": "full"}]}}),
            "unknown file kind 'full'",
        ),
        (_mutated(created_at="yesterday"), "malformed"),
        (_mutated(state="HALF_DONE"), "malformed"),
        (_mutated(generation="seven"), "generation is the string 'seven', not an integer"),
        (_mutated(sign=False, table="other"), "does not match its own checksum"),
    ],
)
def test_corrupt_manifests_raise_corrupt_checkpoint_error(data: bytes, match: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=match) as info:
        CheckpointManifest.from_bytes(data, source="s3://b/t/snapshots/1.json")
    assert "s3://b/t/snapshots/1.json" in str(info.value)  # names the thing that is wrong


def test_unknown_format_version_is_refused_even_if_otherwise_well_formed() -> None:
    """A future writer's format must not be misread by this reader: skip, don't guess."""
    with pytest.raises(CorruptCheckpointError, match=r"reads \[1, 2\]"):
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
    for files in ([DELTA.to_json()], [BASE.to_json(), DELTA.to_json(), DELTA2.to_json()]):
        data = _mutated(partitions={"0": {"next_offset": 5, "files": files}})
        assert CheckpointManifest.from_bytes(data).partitions[0].next_offset == 5
    empty = _mutated(partitions={"0": {"next_offset": 0, "files": []}})
    assert CheckpointManifest.from_bytes(empty).partitions[0].files == ()


def test_a_partition_past_offset_0_without_files_is_corrupt() -> None:
    """Every writer's first checkpoint of a partition is a base (empty if need be): no files
    means they were dropped from the manifest (the table would restore empty)."""
    data = _mutated(partitions={"0": {"next_offset": 5, "files": []}})
    with pytest.raises(CorruptCheckpointError, match="no files, yet it resumes at offset 5"):
        CheckpointManifest.from_bytes(data)


def test_age_uses_the_injected_clock() -> None:
    m = make_manifest(created_at=T0)
    assert m.age_seconds(T0 + timedelta(minutes=2)) == 120


def test_a_manifest_prints_as_one_short_line() -> None:
    """``print(bootstrap_processor(...))`` printed a 3 KB manifest: every file of every partition."""
    m = make_manifest(offsets=dict.fromkeys(range(12), 10))
    shown = repr(m)
    assert "\n" not in shown
    assert len(shown) < 200, shown
    assert f"generation={m.generation}" in shown
    assert "partitions=12" in shown
