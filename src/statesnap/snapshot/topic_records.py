"""The records of a topic snapshot store: their key and JSON envelope, encoded and decoded.

A format of its own, apart from the store that reads and writes it
(:class:`~statesnap.snapshot.topic_store.TopicSnapshotStore`): every reader of the topic must
decode the same bytes the same way, and a malformed or foreign record must be told apart from a
record of ours (skipped) and from one of ours that is broken (corrupt), whatever the store does.

One record per change, in partition 0 of the store topic (created if missing with one partition,
``cleanup.policy=delete`` and ``retention.ms=retention.bytes=-1``: snapshots expire by explicit
:meth:`~statesnap.snapshot.topic_store.TopicSnapshotStore.delete`, never by topic retention, and
compaction would break the chain).

- key: ``<generation:020d>``, or ``<table>/<generation:020d>`` when the store has a ``table``
  (one topic may serve several tables; each table reads only its own records).
- value: a JSON envelope ``{"statesnap_record": "snapshot", "format_version": 1, "table",
  "op": "put" | "delete", "generation", "prev", "writer", "snapshot": <Snapshot.to_json()>}``.
  A delete is a record too (``op: "delete"``, no snapshot), so it can take part in the chain.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from statesnap.checkpoint.jsonfields import as_int, load_json
from statesnap.errors import CorruptCheckpointError
from statesnap.snapshot.model import Snapshot

__all__ = [
    "FORMAT_VERSION",
    "RECORD_KIND",
    "Op",
    "Record",
    "Write",
    "decode_record",
    "encode_record",
    "record_key",
]

log = logging.getLogger(__name__)

RECORD_KIND = "snapshot"
#: Bumped on any change a reader of the previous version would misread.
FORMAT_VERSION = 1

Op = Literal["put", "delete"]


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded store record."""

    offset: int
    table: str | None
    op: Op
    generation: int
    prev: int
    writer: str
    snapshot: Snapshot | None


@dataclass(frozen=True, slots=True)
class Write:
    """What one attempt of an update wants to append."""

    op: Op
    generation: int
    snapshot: Snapshot | None = None


def record_key(table: str | None, generation: int) -> bytes:
    return (f"{generation:020d}" if table is None else f"{table}/{generation:020d}").encode()


def encode_record(table: str | None, write: Write, *, prev: int, writer: str) -> bytes:
    obj: dict[str, Any] = {
        "statesnap_record": RECORD_KIND,
        "format_version": FORMAT_VERSION,
        "table": table,
        "op": write.op,
        "generation": write.generation,
        "prev": prev,
        "writer": writer,
    }
    if write.snapshot is not None:
        obj["snapshot"] = write.snapshot.to_json()
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_record(topic: str, offset: int, value: bytes | None) -> Record | None:
    """The record at *offset*; None for anything that is not a snapshot record (skipped)."""
    if value is None:
        return None
    try:
        obj = load_json(value, source=f"offset {offset} of snapshot topic {topic!r}")
    except CorruptCheckpointError:  # not JSON, or hostile JSON: not a record of ours
        obj = None
    if not isinstance(obj, dict) or obj.get("statesnap_record") != RECORD_KIND:
        log.warning("skipping offset %d of snapshot topic %r: not a snapshot record", offset, topic)
        return None
    where = f"snapshot record at offset {offset} of topic {topic!r}"
    version = obj.get("format_version")
    if version != FORMAT_VERSION:
        raise CorruptCheckpointError(
            f"{where} has format version {version!r}; this statesnap reads version {FORMAT_VERSION} "
            "(was it written by a newer statesnap?)"
        )
    try:
        op = obj["op"]
        if op not in ("put", "delete"):
            raise ValueError(f"unknown op {op!r}")
        table = obj.get("table")
        return Record(
            offset=offset,
            table=None if table is None else str(table),
            op=op,
            generation=as_int(obj["generation"], "generation"),
            prev=as_int(obj["prev"], "prev", lo=-1),
            writer=str(obj["writer"]),
            snapshot=Snapshot.from_json(obj["snapshot"]) if op == "put" else None,
        )
    except (AttributeError, KeyError, TypeError, ValueError, CorruptCheckpointError) as e:
        raise CorruptCheckpointError(f"{where} is malformed: {e}") from e
