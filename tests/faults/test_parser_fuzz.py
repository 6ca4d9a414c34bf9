"""Fuzzing every parser of a stored document a restore trusts: manifest, descriptor, snapshot record
(blob and topic store), Spark journal entry, high-water mark.

Whatever bytes are in the store, a parser either returns a value a writer could have produced or
raises :class:`CorruptCheckpointError` (the caller skips the document). Anything else — a
``RecursionError``, ``ValueError`` on a 5,000-digit number, ``OverflowError`` later — is a
``parser_crashes`` finding. Inputs are valid documents mutated at the byte level and at the JSON
level (a leaf or subtree replaced by hostile values), plus hand-picked pathological documents.
No broker or S3 is needed: the parsers read bytes.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from faults.ledger import CaseLedger
from statesnap.blob import open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, DataFile, PartitionCheckpoint
from statesnap.checkpoint.journal import BatchEntry, BatchRange
from statesnap.checkpoint.jsonfields import MAX_INT64
from statesnap.checkpoint.layout import DESCRIPTOR, HIGH_WATER
from statesnap.checkpoint.manifest import canonical_checksum
from statesnap.errors import CorruptCheckpointError
from statesnap.snapshot.audit import read_high_water
from statesnap.snapshot.model import CheckpointRef, Snapshot, SnapshotState, TaskSnapshot
from statesnap.snapshot.topic_records import decode_record

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _file(p: int, gen: int, kind: str, n: int, nxt: int, after: int | None = None) -> DataFile:
    path = f"data/{gen:020d}/p{p:05d}-{kind}-{n}.parquet"
    return DataFile(path, kind, 10, 1000, "a" * 64, next_offset=nxt, after=after)  # type: ignore[arg-type]


def _partitions() -> dict[int, PartitionCheckpoint]:
    return {
        p: PartitionCheckpoint(
            p,
            30,
            (_file(p, 1, "base", 0, 10), _file(p, 2, "delta", 0, 20, 10), _file(p, 3, "delta", 0, 30, 20)),
        )
        for p in range(2)
    }


MANIFEST = CheckpointManifest("orders", "orders", "c1", 3, _partitions(), T0, writer={"engine": "python"})
RECORD = Snapshot(
    3,
    SnapshotState.COMPLETED,
    T0,
    T0,
    (0, 1),
    {
        "main": TaskSnapshot(
            "main", {("orders", 0): 30, ("orders", 1): 30}, {"orders": CheckpointRef("x", _partitions())}
        )
    },
)
JOURNAL = BatchEntry(7, {0: BatchRange(20, 30, _file(0, 3, "delta", 7, 30)), 1: BatchRange(20, 30, None)})
DESCRIPTOR_BODY = {
    "table": "orders",
    "topic": "orders",
    "cluster_id": "c1",
    "partitions": 2,
    "snapshot_store": "blob",
}


def _parse_manifest(data: bytes) -> None:
    m = CheckpointManifest.from_bytes(data)
    for pc in m.partitions.values():  # what it returns is in range for librdkafka and Arrow
        assert 0 <= pc.next_offset <= MAX_INT64
        assert all(0 <= f.rows <= MAX_INT64 for f in pc.files)


def _parse_topic_record(data: bytes) -> None:
    decode_record("snapshots", 0, data)


def _repo(tmp: Path) -> CheckpointRepository:
    return CheckpointRepository(open_blob_store(str(tmp)), "c1_orders")


def _descriptor(data: bytes, tmp: Path) -> None:
    repo = _repo(tmp)
    repo.store.write(repo.key(DESCRIPTOR), data)
    repo.verify_descriptor()
    repo.descriptor()


def _high_water(data: bytes, tmp: Path) -> None:
    repo = _repo(tmp)
    repo.store.write(repo.key(HIGH_WATER), data)
    read_high_water(repo)


PARSERS: dict[str, tuple[bytes, Callable[[bytes, Path], Any]]] = {
    "manifest": (MANIFEST.to_bytes(), lambda d, _t: _parse_manifest(d)),
    "snapshot-record": (RECORD.to_bytes(), lambda d, _t: Snapshot.from_bytes(d)),
    "topic-record": (
        json.dumps(
            {
                "statesnap_record": "snapshot",
                "format_version": 1,
                "table": "orders",
                "op": "put",
                "generation": 3,
                "prev": -1,
                "writer": "w",
                "snapshot": RECORD.to_json(),
            }
        ).encode(),
        lambda d, _t: _parse_topic_record(d),
    ),
    "journal-entry": (JOURNAL.to_bytes(), lambda d, _t: BatchEntry.from_bytes(d, "journal")),
    "descriptor": (
        json.dumps({**DESCRIPTOR_BODY, "checksum": canonical_checksum(DESCRIPTOR_BODY)}).encode(),
        _descriptor,
    ),
    "high-water": (b'{"generation": 3}', _high_water),
}


HOSTILE: list[Any] = [
    None,
    True,
    -1,
    2**63,
    2**64,
    1e300,
    float("-0.0"),
    "7",
    "",
    "x" * 10_000,
    [],
    {},
    [[[[[]]]]],
    {"a": {"b": {"c": {}}}},
]


def _leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _leaves(v, (*path, i))
    return out


def _replace(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(obj))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


def _json_mutations(original: bytes) -> st.SearchStrategy[bytes]:
    obj = json.loads(original)
    paths = _leaves(obj)

    def build(path: tuple[Any, ...], value: Any, resign: bool, downgrade: bool) -> bytes:
        mutated = _replace(obj, path, value)
        if isinstance(mutated, dict):
            if downgrade and "format_version" in mutated:
                mutated["format_version"] = 1
                mutated.pop("checksum", None)
            elif resign and "checksum" in mutated:
                mutated["checksum"] = canonical_checksum(mutated)
        return json.dumps(mutated).encode()

    return st.builds(
        build,
        st.sampled_from(paths),
        st.sampled_from(HOSTILE) | st.integers(-(2**70), 2**70) | st.text(max_size=30),
        st.booleans(),
        st.booleans(),
    )


def _byte_mutations(original: bytes) -> st.SearchStrategy[bytes]:
    def build(pos: int, cut: bool, byte: int) -> bytes:
        pos %= len(original)
        if cut:
            return original[:pos]
        return original[:pos] + bytes([byte]) + original[pos + 1 :]

    return st.builds(build, st.integers(0, 10**9), st.booleans(), st.integers(0, 255))


PATHOLOGICAL = [
    b"9" * 5000,
    b'{"generation": ' + b"9" * 5000 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    b"NaN",
    b'{"generation": Infinity}',
    b"\xff\xfe\x00",
    b"",
    b"null",
    b'"' + b"\\u0000" * 1000 + b'"',
]


def _run(name: str, data: bytes, tmp: Path, ledger: CaseLedger) -> None:
    parse = PARSERS[name][1]
    try:
        parse(data, tmp)
    except CorruptCheckpointError:
        pass
    except Exception as e:  # a crash: the caller would not skip it
        ledger.fail(
            "parser_crashes",
            f"{name}: {type(e).__name__}: {str(e)[:200]} on {data[:120]!r}\n{traceback.format_exc(limit=3)}",
        )


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parsers_never_crash(name: str, ledger: CaseLedger, long_mode: bool, tmp_path: Path) -> None:
    original = PARSERS[name][0]
    PARSERS[name][1](original, tmp_path)  # the unmutated document parses
    count = 0
    for data in PATHOLOGICAL:
        _run(name, data, tmp_path, ledger)
        count += 1

    @settings(
        max_examples=2000 if long_mode else 300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=_json_mutations(original) | _byte_mutations(original))
    def fuzz(data: bytes) -> None:
        nonlocal count
        count += 1
        _run(name, data, tmp_path, ledger)

    try:
        fuzz()
    finally:
        ledger.tried("parser_fuzz_cases", count)
