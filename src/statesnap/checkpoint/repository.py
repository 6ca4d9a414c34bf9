"""One table's checkpoints in a blob store: list, read, verify, load and commit manifests.

A :class:`CheckpointRepository` is the only component that knows the storage layout; writers
(Python :class:`~statesnap.Table`, Spark jobs) and readers all go through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from statesnap.blob import BlobStore
from statesnap.checkpoint import datafile, layout
from statesnap.checkpoint.jsonfields import as_int, as_map, as_str, load_json
from statesnap.checkpoint.manifest import (
    CheckpointManifest,
    DataFile,
    FileKind,
    PartitionCheckpoint,
    canonical_checksum,
    index_path,
)
from statesnap.checkpoint.partition_files import DecodedPartition, checked_merge, split_or_merge, splittable
from statesnap.errors import (
    BlobExistsError,
    BlobNotFoundError,
    CheckpointConflictError,
    CorruptCheckpointError,
)
from statesnap.keys.index import HashSeed, KeyIndex

__all__ = [
    "INDEX_MIN_ROWS",
    "IO_THREADS",
    "READ_AHEAD",
    "CheckpointRepository",
    "VerifyResult",
    "checked_merge",
]

log = logging.getLogger(__name__)

#: Parallel downloads/uploads; S3 latency dominates small files, so a few in flight pay off.
IO_THREADS = 8
#: Partitions a restore decodes ahead of its consumer: decoding is CPU-bound, so one per core (at
#: least two); each decoded partition is held until taken. Downloads run IO_THREADS ahead.
READ_AHEAD = min(IO_THREADS, max(2, os.cpu_count() or 2))
#: A base of fewer rows gets no persisted key index: a restore builds one in under ~8 ms (65 k
#: keys, measured; ~100 ns a key), about what one more object-store request costs, and the
#: table's many small partitions then cost no extra files.
INDEX_MIN_ROWS = 1 << 16


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of verifying one generation; ``problems`` is empty when it is usable."""

    generation: int
    manifest: CheckpointManifest | None
    problems: tuple[str, ...]
    #: The manifest was deleted (by GC or a user) while it was being verified: not corrupt, gone.
    vanished: bool = False
    #: Those of ``problems`` that concern a base's key index alone (missing, damaged): the
    #: checkpoint is not ``ok`` but still ``restorable`` (restores build the index instead).
    index_problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def restorable(self) -> bool:
        """Whether its data files are whole, whatever its key indexes' state."""
        return len(self.problems) == len(self.index_problems)


class CheckpointRepository:
    """Checkpoints of one table: ``<root>/<cluster-id>_<table>/`` in *store*."""

    def __init__(self, store: BlobStore, directory: str) -> None:
        self.store = store
        self.directory = directory.strip("/")

    @classmethod
    def for_table(cls, store: BlobStore, cluster_id: str, table: str) -> CheckpointRepository:
        return cls(store, layout.table_dir(cluster_id, table))

    def __repr__(self) -> str:
        return f"CheckpointRepository({self.url!r})"

    @property
    def url(self) -> str:
        return f"{self.store.url.rstrip('/')}/{self.directory}"

    @property
    def shown(self) -> str:
        """The table's directory under the location as the user gave it, for messages."""
        return f"{self.store.shown.rstrip('/')}/{self.directory}"

    def key(self, relative: str) -> str:
        return f"{self.directory}/{relative}"

    # --- reading -------------------------------------------------------------------------------

    def generations(self) -> list[int]:
        """Generations that have a manifest, newest first."""
        gens = []
        for blob in self.store.list(self.key(layout.SNAPSHOTS_DIR) + "/"):
            gen = layout.manifest_generation(blob.key[len(self.directory) + 1 :])
            if gen is not None:
                gens.append(gen)
        return sorted(gens, reverse=True)

    def read_manifest(self, generation: int) -> CheckpointManifest:
        """Parse one manifest; a missing one raises BlobNotFoundError, a bad one CorruptCheckpointError."""
        key = self.key(layout.manifest_key(generation))
        manifest = CheckpointManifest.from_bytes(
            self.store.read(key), source=f"{self.url}/{layout.manifest_key(generation)}"
        )
        if manifest.generation != generation:
            raise CorruptCheckpointError(
                f"{key}: manifest says generation {manifest.generation}, its name says {generation}"
            )
        return manifest

    def manifests(self) -> Iterator[tuple[int, CheckpointManifest | CorruptCheckpointError]]:
        """Every generation newest first, with its manifest or the reason it cannot be read."""
        for gen in self.generations():
            try:
                yield gen, self.read_manifest(gen)
            except CorruptCheckpointError as e:
                yield gen, e
            except BlobNotFoundError:
                continue  # deleted by GC between list and read

    def latest(self) -> CheckpointManifest | None:
        """Newest readable manifest (not deep-verified), or None."""
        for _, item in self.manifests():
            if isinstance(item, CheckpointManifest):
                return item
        return None

    def read_file(self, f: DataFile) -> pa.Table:
        """Download one data file and check size and checksum before trusting it."""
        return self.decode_file(f, self.fetch_file(f))

    def fetch_file(self, f: DataFile) -> bytes:
        """Download one data file's bytes, checking they are all there."""
        try:
            data = self.store.read(self.key(f.path))
        except BlobNotFoundError as e:
            raise CorruptCheckpointError(f"{self.url}/{f.path}: data file missing") from e
        if len(data) != f.bytes:
            raise CorruptCheckpointError(
                f"{self.url}/{f.path}: size {len(data)} != {f.bytes} recorded in the manifest"
            )
        return data

    def decode_file(self, f: DataFile, data: bytes) -> pa.Table:
        """A downloaded data file's rows, once its checksum matches the manifest's."""
        return datafile.decode(data, expected_sha256=f.sha256, source=f"{self.url}/{f.path}")

    def load_partition(self, manifest: CheckpointManifest, partition: int) -> pa.Table:
        """The partition's table at this checkpoint: base + deltas merged, tombstones removed,
        once the files agree with what the manifest claims (see :func:`checked_merge`)."""
        return self.merge_partition(manifest.partitions[partition])

    def merge_partition(self, pc: PartitionCheckpoint) -> pa.Table:
        """:meth:`load_partition` for a partition's entry alone (a Spark task gets no manifest)."""
        return checked_merge(pc, [self.read_file(f) for f in pc.files], source=self.url)

    def merge_files(self, files: Sequence[DataFile]) -> pa.Table:
        """*files* merged in order, each file's size and checksum verified, but not checked against
        a manifest's claims (rows, offsets, keys: :func:`checked_merge`). For writers building on
        files they have no partition entry for (a Spark bootstrap split's predecessors, the files
        the streaming materializer compacts)."""
        return datafile.merge([self.read_file(f) for f in files])

    def decode_partition(
        self,
        manifest: CheckpointManifest,
        partition: int,
        downloads: list[Future[bytes]],
        index: Future[bytes] | None = None,
    ) -> DecodedPartition:
        """:meth:`load_partition` for files whose downloads are under way (one future per file),
        split over the base's persisted key index when *index* (its download) is given and
        verifies (see :func:`~statesnap.checkpoint.partition_files.split_or_merge`)."""
        pc = manifest.partitions[partition]
        pairs = zip(pc.files, downloads, strict=True)
        tables = [self.decode_file(f, d.result()) for f, d in pairs]
        found = None if index is None else self.read_index(pc, index)
        return split_or_merge(manifest, partition, tables, found, source=self.url)

    def read_index(self, pc: PartitionCheckpoint, download: Future[bytes]) -> KeyIndex | None:
        """The persisted key index of the partition's base, or None (the store then builds
        one). A missing or damaged index is logged and ignored, not a reason to skip the
        checkpoint: it is derived from the base, which verifies on its own, so the state is whole
        without it; and a GC of a statesnap before indexes (which sees it as an unreferenced file)
        may have deleted it. ``checkpoints verify`` reports it as damage all the same."""
        f = pc.files[0].index
        if f is None:
            return None
        where = f"{self.url}/{f.path}"
        try:
            data = download.result()
            if len(data) != f.bytes:
                raise CorruptCheckpointError(
                    f"{where}: size {len(data)} != {f.bytes} recorded in the manifest"
                )
            if hashlib.sha256(data).hexdigest() != f.sha256:
                raise CorruptCheckpointError(f"{where}: checksum mismatch")
            return KeyIndex.from_bytes(data, rows=pc.files[0].rows, source=where)
        except (BlobNotFoundError, CorruptCheckpointError) as e:
            log.warning("key index ignored, the store builds it: %s", e)
            return None

    def iter_partitions(
        self, manifest: CheckpointManifest, partitions: list[int] | None = None
    ) -> Iterator[tuple[int, pa.Table]]:
        """Load partitions merged, yielding ``(partition, rows)`` in order (see :meth:`iter_decoded`)."""
        for p, decoded in self.iter_decoded(manifest, partitions, indexes=False):
            yield p, decoded.merged()

    def iter_decoded(
        self, manifest: CheckpointManifest, partitions: list[int] | None = None, *, indexes: bool = True
    ) -> Iterator[tuple[int, DecodedPartition]]:
        """Load partitions, yielding each decoded and verified, in order. Two windows ahead of
        the caller: downloads of the next :data:`IO_THREADS` partitions (S3 latency hides behind
        them; compressed bytes are small) and decodes of the next :data:`READ_AHEAD` (CPU-bound;
        a decoded partition is held until taken). A restore into a store that does not keep the
        decoded tables (RocksDB) so holds a few partitions at a time, not the whole table (issue
        9: bounded memory). *indexes*: for a store that reads bases' persisted key indexes, also
        download them and hand partitions over split where that pays (see
        :func:`~statesnap.checkpoint.partition_files.splittable`); merged otherwise."""
        wanted = iter(sorted(manifest.partitions) if partitions is None else partitions)
        fetching: deque[tuple[int, list[Future[bytes]], Future[bytes] | None]] = deque()
        decoding: deque[tuple[int, Future[DecodedPartition]]] = deque()
        with (
            ThreadPoolExecutor(IO_THREADS, thread_name_prefix="statesnap-fetch") as fetch_pool,
            ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="statesnap-load") as decode_pool,
        ):

            def fetch_next() -> None:
                p = next(wanted, None)
                if p is not None:
                    pc = manifest.partitions[p]
                    index = pc.files[0].index if indexes and splittable(pc) else None
                    fetching.append(
                        (
                            p,
                            [fetch_pool.submit(self.fetch_file, f) for f in pc.files],
                            fetch_pool.submit(self.store.read, self.key(index.path)) if index else None,
                        )
                    )

            def decode_next() -> None:
                if fetching:
                    p, downloads, index = fetching.popleft()
                    decoding.append(
                        (p, decode_pool.submit(self.decode_partition, manifest, p, downloads, index))
                    )
                    fetch_next()

            for _ in range(IO_THREADS):
                fetch_next()
            for _ in range(READ_AHEAD):
                decode_next()
            try:
                while decoding:
                    p, decoded = decoding.popleft()
                    decode_next()  # keep both windows full while the caller takes this one
                    yield p, decoded.result()
            finally:
                for _, decoded in decoding:
                    decoded.cancel()
                for _, downloads, index in fetching:
                    for d in downloads:
                        d.cancel()
                    if index is not None:
                        index.cancel()

    def verify(self, generation: int, *, deep: bool = True) -> VerifyResult:
        """Check a generation as a restore would: manifest readable, COMPLETED, of this table
        directory's table and cluster (and the descriptor's topic), every file present with the
        right size (and, when *deep*, checksum and Parquet structure; a key index's checksum and
        header). A generation deleted while it was checked is reported ``vanished``, not corrupt."""
        try:
            manifest = self.read_manifest(generation)
        except BlobNotFoundError:
            return VerifyResult(generation, None, (), vanished=True)
        except CorruptCheckpointError as e:
            return VerifyResult(generation, None, (str(e),))
        problems = self._identity_problems(manifest)
        present = {b.key: b.size for b in self.store.list(self.key(layout.DATA_DIR) + "/")}
        index_problems: list[str] = []
        for f in manifest.all_files:
            size = present.get(self.key(f.path))
            found = problems if f.kind is not FileKind.INDEX else index_problems
            if size is None:
                found.append(f"{f.path}: {'key index' if f.kind is FileKind.INDEX else 'data file'} missing")
            elif size != f.bytes:
                found.append(f"{f.path}: size {size} != {f.bytes} recorded in the manifest")
        if deep and not problems:

            def check(partition: int) -> str | None:
                try:
                    self.load_partition(manifest, partition)  # checksums, rows, offsets, keys
                except CorruptCheckpointError as e:
                    return str(e)
                return None

            def check_index(f: DataFile) -> str | None:
                try:
                    data = self.fetch_file(f)
                    if hashlib.sha256(data).hexdigest() != f.sha256:
                        raise CorruptCheckpointError(f"{self.url}/{f.path}: checksum mismatch")
                    KeyIndex.from_bytes(data, rows=f.rows, source=f"{self.url}/{f.path}")
                except CorruptCheckpointError as e:
                    return str(e)
                return None

            with ThreadPoolExecutor(READ_AHEAD) as pool:
                problems.extend(p for p in pool.map(check, sorted(manifest.partitions)) if p)
                if not index_problems:
                    index_problems.extend(p for p in pool.map(check_index, manifest.index_files) if p)
        problems += index_problems
        if problems and not self.store.exists(self.key(layout.manifest_key(generation))):
            return VerifyResult(generation, None, (), vanished=True)  # GC took it meanwhile
        return VerifyResult(generation, manifest, tuple(problems), index_problems=tuple(index_problems))

    def _identity_problems(self, manifest: CheckpointManifest) -> list[str]:
        problems = []
        if manifest.state.value != "COMPLETED":
            problems.append(f"state is {manifest.state.value}, not COMPLETED")
        name = self.directory.rsplit("/", 1)[-1]
        if name != layout.table_dir(manifest.cluster_id, manifest.table):
            problems.append(
                f"manifest names table {manifest.table!r} of cluster {manifest.cluster_id!r}, "
                f"not the table directory {name!r}"
            )
        described = self.descriptor() or {}
        if described.get("topic") not in (None, manifest.topic):
            problems.append(f"manifest names topic {manifest.topic!r}, the table's is {described['topic']!r}")
        return problems

    # --- writing -------------------------------------------------------------------------------

    def next_generation(self) -> int:
        """One past every generation in use, including data directories of unfinished writers."""
        top = 0
        for blob in self.store.list(self.directory + "/"):
            rel = blob.key[len(self.directory) + 1 :]
            gen = layout.manifest_generation(rel)
            if gen is None:
                gen = layout.data_generation(rel)
            if gen is None:
                gen = layout.record_generation(rel)
            if gen is not None:
                top = max(top, gen)
        return top + 1

    def write_file(self, generation: int, partition: int, kind: str, n: int, table: pa.Table) -> DataFile:
        """Write one data file (write-once) and describe it for the manifest; a base of at least
        :data:`INDEX_MIN_ROWS` rows gets its key index written beside it, after it (see
        :meth:`write_index`)."""
        rows = datafile.sorted_rows(table)
        encoded = datafile.encode(rows, sort=False)
        rel = layout.data_key(generation, partition, kind, n)
        try:
            self.store.write(self.key(rel), encoded.data, if_absent=True)
        except BlobExistsError as e:
            raise CheckpointConflictError(
                f"{self.url}/{rel} already exists: another writer is using generation {generation}"
            ) from e
        base = kind == "base"
        return DataFile(
            rel,
            FileKind.BASE if base else FileKind.DELTA,
            encoded.rows,
            len(encoded.data),
            encoded.sha256,
            index=self.write_index(rel, rows) if base else None,
        )

    def write_index(self, base: str, rows: pa.Table) -> DataFile | None:
        """Write the persisted key index of the base file *base* (its *rows*, in file order) under
        a fresh random seed, or None for a small base (:data:`INDEX_MIN_ROWS`). The base is
        written first, so a same-named index exists only beside its own base: one already there
        (a retried Spark task's) is described, not rewritten."""
        if rows.num_rows < INDEX_MIN_ROWS:
            return None
        rel = index_path(base)
        data = KeyIndex.of_keys(rows.column("key"), HashSeed.fresh()).to_bytes()
        try:
            self.store.write(self.key(rel), data, if_absent=True)
        except BlobExistsError:
            data = self.store.read(self.key(rel))
        return DataFile(rel, FileKind.INDEX, rows.num_rows, len(data), hashlib.sha256(data).hexdigest())

    def ensure_descriptor(
        self, table: str, topic: str, cluster_id: str, partitions: int, snapshot_store: str = "blob"
    ) -> dict[str, Any]:
        """Write the table descriptor once, so tools find the table (and where its snapshot
        records live) before its first checkpoint; returns the descriptor in force."""
        existing = self.descriptor()
        if existing is not None:
            return existing
        body: dict[str, Any] = {
            "table": table,
            "topic": topic,
            "cluster_id": cluster_id,
            "partitions": partitions,
            "snapshot_store": snapshot_store,
        }
        body["checksum"] = canonical_checksum(body)
        with contextlib.suppress(BlobExistsError):
            self.store.write(self.key(layout.DESCRIPTOR), json.dumps(body).encode(), if_absent=True)
        return self.descriptor() or body

    def verify_descriptor(self) -> list[str]:
        """Problems with the table descriptor (a missing one is fine: older tables have none).

        It must name this directory's table and cluster, a positive partition count and match its
        own checksum where it has one (descriptors written before format 2 have none).
        """
        try:
            data = self.store.read(self.key(layout.DESCRIPTOR))
        except BlobNotFoundError:
            return []
        try:
            obj = as_map(load_json(data, source=layout.DESCRIPTOR), layout.DESCRIPTOR)
            table = as_str(obj.get("table"), f"{layout.DESCRIPTOR}: table", max_len=255)
            as_str(obj.get("topic"), f"{layout.DESCRIPTOR}: topic", max_len=255)
            cluster_id = as_str(obj.get("cluster_id"), f"{layout.DESCRIPTOR}: cluster_id", max_len=255)
            if "partitions" in obj:
                as_int(obj["partitions"], f"{layout.DESCRIPTOR}: partitions", lo=1, hi=2**31 - 1)
            as_str(obj.get("snapshot_store", "blob"), f"{layout.DESCRIPTOR}: snapshot_store", max_len=300)
        except CorruptCheckpointError as e:
            return [str(e)]
        problems = []
        if "checksum" in obj and obj["checksum"] != canonical_checksum(obj):
            problems.append(f"{layout.DESCRIPTOR}: does not match its own checksum (edited or damaged)")
        name = self.directory.rsplit("/", 1)[-1]
        if name != layout.table_dir(cluster_id, table):
            problems.append(
                f"{layout.DESCRIPTOR}: names table {table!r} of cluster {cluster_id!r}, not the table "
                f"directory {name!r}"
            )
        return problems

    def descriptor(self) -> dict[str, Any] | None:
        try:
            obj = load_json(self.store.read(self.key(layout.DESCRIPTOR)), source=layout.DESCRIPTOR)
        except (BlobNotFoundError, CorruptCheckpointError):
            return None
        return obj if isinstance(obj, dict) else None

    def commit(self, manifest: CheckpointManifest) -> None:
        """Publish a checkpoint by writing its manifest, write-once: the last step of every writer."""
        rel = layout.manifest_key(manifest.generation)
        try:
            self.store.write(self.key(rel), manifest.to_bytes(), if_absent=True)
        except BlobExistsError as e:
            raise CheckpointConflictError(
                f"generation {manifest.generation} of {self.url} was committed by another writer"
            ) from e
        log.info(
            "committed checkpoint %s generation %d (%d rows, %d bytes)",
            self.url,
            manifest.generation,
            manifest.total_rows,
            manifest.total_bytes,
        )
