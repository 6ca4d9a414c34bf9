"""On-disk state store on RocksDB (rocksdict), for tables larger than memory.

Restores build SST files from checkpoint data and ingest them, which skips the memtable, WAL and
compaction that a million individual puts would pay for. The directory is scratch space: it is
wiped at start-up and rebuilt from the newest checkpoint plus the changelog's tail.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pyarrow as pa
from rocksdict import Options, Rdict, SstFileWriter, WriteBatch, WriteOptions

from statesnap.stores.base import (
    HEADER_SIZE,
    HEADER_STRUCT,
    NO_TIMESTAMP,
    KafkaMessage,
    Record,
    decode_rows,
    encode_rows,
)

_EXPORT_CHUNK = 256 * 1024


class RocksDBStore:
    """A RocksDB database in *path* holding key → header+value blobs."""

    kind = "rocksdb"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        self._open()

    def _open(self) -> None:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.increase_parallelism(2)
        self._db = Rdict(str(self.path / "db"), options=opts)
        # The changelog is the source of truth and the directory is rebuilt at start-up, so the
        # write-ahead log would only double the write cost.
        self._write_opts = WriteOptions()
        self._write_opts.disable_wal = True  # type: ignore[method-assign,assignment]
        self._db.set_write_options(self._write_opts)
        self._count: int | None = 0

    def get(self, key: bytes) -> bytes | None:
        blob = self._db.get(key)
        return None if blob is None else bytes(blob[HEADER_SIZE:])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self._db.key_may_exist(key) and self._db.get(key) is not None

    def __len__(self) -> int:
        """Exact; after writes it costs one scan of the keys (cached until the next write)."""
        if self._count is None:
            self._count = sum(1 for _ in self._db.keys())  # noqa: SIM118 - Rdict iteration is keys()
        return self._count

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        for key, blob in self._db.items():
            yield cast(bytes, key), cast(bytes, blob)[HEADER_SIZE:]

    def apply(self, partition: int, records: Sequence[Record]) -> None:
        self._write(partition, records)

    def apply_messages(self, partition: int, messages: Sequence[KafkaMessage]) -> None:
        records: list[Record] = []
        for m in messages:
            key = m.key()
            if key is None:
                continue
            ts_type, ts = m.timestamp()
            records.append((key, m.value(), m.offset(), ts if ts_type else NO_TIMESTAMP))
        self._write(partition, records)

    def _write(self, partition: int, records: Sequence[Record]) -> None:
        if not records:
            return
        batch = WriteBatch(raw_mode=True)
        pack = HEADER_STRUCT.pack
        for key, value, offset, ts in records:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, pack(partition, offset, ts) + value)
        self._db.write(batch)
        # Whether a record inserted or replaced a key would take a read per record (a block read
        # once the table is bigger than the cache): the tail replay measured 2.5x slower with it.
        # The count is recomputed on demand instead.
        self._count = None

    def load(self, partition: int, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        keys = rows.column("key").combine_chunks().to_pylist()
        blobs = encode_rows(partition, rows).to_pylist()
        with tempfile.TemporaryDirectory(dir=self.path) as tmp:
            sst = str(Path(tmp) / f"p{partition}.sst")
            writer = SstFileWriter(Options(raw_mode=True))
            writer.open(sst)
            for key, blob in zip(keys, blobs, strict=True):
                writer[key] = blob
            writer.finish()
            self._db.ingest_external_file([sst])
        if self._count is not None:
            self._count += len(keys)  # partitions hold disjoint keys

    def export(self) -> dict[int, pa.Table]:
        snapshot = self._db.snapshot()
        parts: dict[int, list[pa.Table]] = {}
        keys: list[bytes] = []
        blobs: list[bytes] = []

        def drain() -> None:
            for p, t in decode_rows(pa.array(keys, pa.binary()), pa.array(blobs, pa.binary())).items():
                parts.setdefault(p, []).append(t)
            keys.clear()
            blobs.clear()

        for key, blob in snapshot.items():
            keys.append(cast(bytes, key))
            blobs.append(cast(bytes, blob))
            if len(keys) >= _EXPORT_CHUNK:
                drain()
        drain()
        del snapshot
        # Chunks come from one key-ordered scan, so concatenation keeps each partition sorted.
        return {p: pa.concat_tables(ts) for p, ts in parts.items()}

    def clear(self) -> None:
        self._db.close()
        shutil.rmtree(self.path / "db", ignore_errors=True)
        self._open()

    def flush(self) -> None:
        self._db.flush()

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self.path, ignore_errors=True)
