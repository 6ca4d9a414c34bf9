"""What ``statesnap dump`` prints and checks: a table's digest, and one store of a processor as its
checkpoint holds it (``--store``).

A store is read straight from the checkpoint's files (:mod:`statesnap.processor.readback`): no
broker is needed (``-b`` only picks the cluster's checkpoints when several share the root), and no
tail is replayed — bringing a store past its checkpoint means running the processor's handler,
which only the processor (``statesnap run``) does.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from statesnap.cli.output import Output
from statesnap.errors import ConfigError

if TYPE_CHECKING:  # loaded to register `dump` (SERDES): what reads a store loads when it runs
    from statesnap.kafka.config import KafkaSettings
    from statesnap.processor.stores import StoreKind
    from statesnap.serde import Serde
    from statesnap.task.restore import RestoreReport

__all__ = [
    "SERDES",
    "STATE_STORE_KINDS",
    "StoreDigest",
    "StoreDumpRequest",
    "TableDigest",
    "check_dump_flags",
    "check_store_flags",
    "dump_store",
    "printed_field",
]

#: The serdes ``dump`` can print through (no schema registry on the command line).
SERDES = ("bytes", "string", "json")


@dataclass(frozen=True, slots=True)
class StoreDumpRequest:
    """What ``dump --store`` was asked for, flags already checked."""

    table: str
    store: str
    checkpoints: str
    storage_options: Mapping[str, str]
    generation: int | None
    topic: str | None
    kafka: KafkaSettings | None
    key_serde: str
    value_serde: str


#: The local store kinds ``--store`` named before it named a processor's store.
STATE_STORE_KINDS = ("auto", "memory", "columnar", "rocksdb")


def check_store_flags(
    *,
    table: str | None,
    checkpoints: str | None,
    no_checkpoint: bool,
    state_store: str | None,
    store: str,
    topic: str | None,
    verb: str = "read",
) -> tuple[str, str]:
    """(table, checkpoints) once ``--store`` can be honoured with the other flags; one line each
    for what cannot, before any I/O."""
    if store in STATE_STORE_KINDS and topic and not table:
        raise click.UsageError(
            f"--store names a processor's store (with --table); the local store kind is --state-store {store}"
        )
    if not table:
        raise click.UsageError(f"--store needs --table NAME: the processor whose store to {verb}")
    if no_checkpoint or not checkpoints:
        raise click.UsageError(
            "--store reads a store from its checkpoint: give --checkpoints URL (and no --no-checkpoint)"
        )
    if state_store is not None:
        raise click.UsageError("--state-store does not apply to --store: a store is read from its files")
    return table, checkpoints


@dataclass(frozen=True, slots=True)
class StoreDigest:
    """``dump --store --digest``: the store's row count and digest, and the checkpoint read.

    The keys are those of ``dump --digest`` (a store is never tailed: ``tail`` is false and
    ``replayed_records`` 0), plus ``store`` and ``kind``."""

    table: str
    topic: str
    store: str
    kind: StoreKind
    keys: int
    digest: str
    checkpoint: int
    offsets: Mapping[int, int]
    seconds: float
    skipped: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "topic": self.topic,
            "store": self.store,
            "kind": str(self.kind),
            "keys": self.keys,
            "digest": self.digest,
            "checkpoint": self.checkpoint,
            "replayed_records": 0,
            "restore_seconds": round(self.seconds, 3),
            "offsets": dict(self.offsets),
            "tail": False,
            "skipped": self.skipped,
        }

    def summary(self) -> str:
        return (
            f"store {self.store!r} of {self.table}: {self.keys} keys, digest {self.digest} "
            f"(checkpoint {self.checkpoint} as it is, no tail; read in {self.seconds:.2f}s)"
        )


def printed_field(name: str, data: bytes, serde: Serde | None) -> dict[str, Any]:
    """*name* as the serde reads it, or (no serde) UTF-8 text or ``<name>_b64``."""
    if serde is not None:
        return {name: serde.deserialize(data)}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode()}


def _serde(name: str) -> Serde | None:
    from statesnap.serde import resolve_serde

    return None if name == "bytes" else resolve_serde(name)


def dump_store(request: StoreDumpRequest, *, digest: bool, as_json: bool) -> None:
    """Print the store's rows (JSON lines in key order per partition) or its digest."""
    from statesnap.blob import open_blob_store
    from statesnap.kafka.admin import KafkaAdmin
    from statesnap.processor.readback import StoreCheckpoint, store_digest
    from statesnap.processor.stores import StoreKind

    started = time.monotonic()
    blob_store = open_blob_store(request.checkpoints, **dict(request.storage_options))
    cluster_id = KafkaAdmin(request.kafka).cluster_id() if request.kafka is not None else None
    chosen = StoreCheckpoint.open(
        blob_store, request.table, request.store, generation=request.generation, cluster_id=cluster_id
    )
    manifest = chosen.manifest
    if request.topic is not None and request.topic != manifest.topic:
        raise ConfigError(
            f"processor {request.table!r} reads topic {manifest.topic!r}, not {request.topic!r} (drop -t, "
            "or fix it)"
        )
    if digest:
        tables = [rows for _, rows in chosen.partitions()]
        hexdigest, keys = store_digest(tables)
        Output(as_json).result(
            StoreDigest(
                request.table,
                manifest.topic,
                request.store,
                chosen.info.kind,
                keys,
                hexdigest,
                manifest.generation,
                manifest.offsets,
                time.monotonic() - started,
                chosen.skipped_json(),
            )
        )
        return
    key_serde, value_serde = _serde(request.key_serde), _serde(request.value_serde)
    window = chosen.info.kind is StoreKind.WINDOW
    out = sys.stdout
    for partition, rows in chosen.partitions():
        columns = ["key", "value", "window_start", "window_end"] if window else ["key", "value"]
        for row in rows.select(columns).to_pylist():
            line: dict[str, Any] = {
                **printed_field("key", row["key"], key_serde),
                **printed_field("value", row["value"], value_serde),
                "partition": partition,
            }
            if window:
                line.update(window_start=row["window_start"], window_end=row["window_end"])
            out.write(json.dumps(line, default=str) + "\n")
    out.flush()


@dataclass(frozen=True, slots=True)
class TableDigest:
    """``dump --digest``: the table's key count and digest, and how it was restored."""

    table: str
    topic: str
    keys: int
    digest: str
    report: RestoreReport
    offsets: dict[int, int]
    tail: bool

    def to_json(self) -> dict[str, Any]:
        report = self.report
        return {
            "table": self.table,
            "topic": self.topic,
            "keys": self.keys,
            "digest": self.digest,
            "checkpoint": report.checkpoint,
            "replayed_records": report.replayed_records,
            "restore_seconds": round(report.restore_seconds, 3),
            "offsets": self.offsets,
            "tail": self.tail,
            "skipped": report.to_json()["skipped"],
        }

    def summary(self) -> str:
        report = self.report
        how = "as it is, no tail" if not self.tail else f"replayed {report.replayed_records} records"
        return (
            f"{self.keys} keys, digest {self.digest} (checkpoint {report.checkpoint}, "
            f"{how} in {report.restore_seconds:.2f}s)"
        )


def check_dump_flags(
    checkpoints: str | None,
    no_checkpoint: bool,
    require_checkpoint: bool,
    generation: int | None,
    no_tail: bool,
) -> None:
    """Refuse flag combinations that cannot all be honoured, in one line, before any I/O."""
    if generation is not None and no_checkpoint:
        raise click.UsageError("--generation restores a checkpoint; it cannot go with --no-checkpoint")
    if require_checkpoint and (no_checkpoint or not checkpoints):
        raise click.UsageError("--require-checkpoint needs --checkpoints URL and no --no-checkpoint")
    if no_tail and generation is None:
        raise click.UsageError("--no-tail needs --generation G: it shows the table as snapshot G holds it")
    if generation is not None and not checkpoints:
        raise click.UsageError("--generation needs --checkpoints URL (the store that holds it)")
