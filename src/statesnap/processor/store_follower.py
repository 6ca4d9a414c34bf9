"""A read-only replica of one processor store, as of its newest checkpoint (``statesnap serve --store``).

A table's follower tails the changelog; a store has no changelog (the point of processors): its
state moves only when the processor's handler runs. So a store follower holds the store as the
newest verified checkpoint holds it and polls the checkpoint store for a newer generation, loading
it when one appears — freshness is the owner's checkpoint interval plus the poll interval. It
never writes anywhere and needs no broker.

Cost of following. An idle poll is one listing of the table's manifests (one S3 LIST): the manifest
and the store's files are read, and verified, only when a generation newer than any seen appears.
Polling with a full verified open instead cost a GET per manifest and per partition's file each
time (measured: ~2 requests a second for an 8-partition store at the 5 s default, and an S3 GET
bill that grows with the partition count). The cadence is ``poll_seconds``
(``serve --store --poll-interval``, default :data:`DEFAULT_POLL_SECONDS`).

It answers what :func:`statesnap.serve.create_app` asks of a replica (lookups, ordered scans,
offsets, status, waits), so the HTTP API serves a store exactly as it serves a table. Keys are the
user's key bytes; a window store's are its stored keys (the 8-byte window start, big-endian
offset-binary, then the key), the bytes ``dump --store`` digests. A key-value key written in two
partitions' stores (a handler may write any key) is served from the higher partition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from statesnap.blob import BlobStore
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
from statesnap.deadline import Deadline
from statesnap.errors import StatesnapError, TableStateError
from statesnap.failure_log import FailureLog
from statesnap.processor.readback import StoreCheckpoint, StoreRows
from statesnap.python.status import FollowerStatus
from statesnap.task.lifecycle import TaskPhase

__all__ = ["DEFAULT_POLL_SECONDS", "StoreFollower"]

log = logging.getLogger(__name__)

#: How often the checkpoint store is asked for a newer generation.
DEFAULT_POLL_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class _Loaded:
    """One generation of the store in memory, with the checkpoint it came from."""

    manifest: CheckpointManifest
    rows: StoreRows
    seconds: float


class StoreFollower:
    """Store *store* of processor *table* under *blob_store*, refreshed every *poll_seconds*.

    Lifecycle as a :class:`~statesnap.python.follower.Follower`'s: ``start_in_background()``
    loads the newest checkpoint on a thread (``restoring``, then ``running``); ``close()`` stops
    polling. A failed first load is ``failed`` with :attr:`error`; a failed refresh is logged and
    the generation held is served on.
    """

    def __init__(
        self,
        blob_store: BlobStore,
        table: str,
        store: str,
        *,
        cluster_id: str | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        key_filter: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.blob_store = blob_store
        self.table = table
        self.store = store
        self.cluster_id = cluster_id
        self.poll_seconds = poll_seconds
        self.key_filter = key_filter
        self._loaded: _Loaded | None = None
        self._state = TaskPhase.NEW
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loaded_at: float | None = None
        #: Where the table's checkpoints are, once found, and the newest generation a full open
        #: considered (loaded or skipped as corrupt): a poll lists, and opens only past it.
        self._repo: CheckpointRepository | None = None
        self._considered = -1
        self._failures = FailureLog(log)

    # --- identity and state --------------------------------------------------------------------

    @property
    def name(self) -> str:
        """What the HTTP API serves it as: the store's name."""
        return self.store

    @property
    def topic(self) -> str:
        loaded = self._loaded
        return loaded.manifest.topic if loaded is not None else ""

    @property
    def state(self) -> TaskPhase:
        return self._state

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def generation(self) -> int | None:
        """The checkpoint generation served (None before the first load)."""
        loaded = self._loaded
        return loaded.manifest.generation if loaded is not None else None

    # --- life cycle ----------------------------------------------------------------------------

    def load(self) -> bool:
        """Load the newest usable checkpoint if it is newer than the one held; whether it was.

        Once one is held, a generation no newer than the newest already considered is not
        opened again (see the module's docstring): a corrupt newest checkpoint is skipped once,
        with its warning, not re-verified at every poll."""
        if self._repo is not None and max(self._repo.generations(), default=-1) <= self._considered:
            return False
        started = time.monotonic()
        chosen = StoreCheckpoint.open(self.blob_store, self.table, self.store, cluster_id=self.cluster_id)
        self._repo = chosen.repo
        self._considered = max(
            [self._considered, chosen.manifest.generation, *(s.generation for s in chosen.skipped)]
        )
        current = self._loaded
        if current is not None and chosen.manifest.generation <= current.manifest.generation:
            return False
        values, newest = StoreRows.read(chosen)
        rows = StoreRows(values, key_filter=self.key_filter, newest_ms=newest)
        loaded = _Loaded(chosen.manifest, rows, time.monotonic() - started)
        with self._changed:
            self._loaded = loaded
            self._loaded_at = time.monotonic()
            self._changed.notify_all()
        log.info(
            "store %s of %s: serving generation %d (%d keys)",
            self.store,
            self.table,
            loaded.manifest.generation,
            len(loaded.rows),
        )
        return True

    def start_in_background(self, *, on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Load the newest checkpoint, then poll for newer ones, on a daemon thread. A first load
        that fails is handed to *on_failure* (the caller reports it: ``statesnap serve`` stops
        with it), else logged as an ERROR; either way :attr:`error` holds it."""
        if self._thread is not None:
            return
        self._state = TaskPhase.RESTORING
        self._thread = threading.Thread(
            target=self._run, args=(on_failure,), name=f"statesnap-store-{self.store}", daemon=True
        )
        self._thread.start()

    def _run(self, on_failure: Callable[[BaseException], None] | None) -> None:
        try:
            self.load()
        except Exception as e:
            self._error = e
            self._state = TaskPhase.FAILED
            with self._changed:
                self._changed.notify_all()
            if on_failure is not None:
                on_failure(e)
            else:
                log.error("store %s of %s: %s: %s", self.store, self.table, type(e).__name__, e)
            return
        self._state = TaskPhase.RUNNING
        while not self._stop.wait(self.poll_seconds):
            try:
                self.load()
            except StatesnapError as e:  # the store unreachable a while: serve what is held
                self._failures.failed(
                    "refresh",
                    "store %s of %s: refresh failed, serving generation %s, retrying every %.3g s: %s: %s",
                    self.store,
                    self.table,
                    self.generation,
                    self.poll_seconds,
                    type(e).__name__,
                    e,
                )
            else:
                self._failures.recovered(
                    "refresh", "store %s of %s: refreshing works again", self.store, self.table
                )

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=max(10.0, self.poll_seconds))
        if self._state is not TaskPhase.FAILED:
            self._state = TaskPhase.CLOSED

    # --- reads ---------------------------------------------------------------------------------

    def _held(self) -> _Loaded:
        loaded = self._loaded
        if loaded is None:
            raise TableStateError("read", str(self._state), "running")
        return loaded

    def keeps(self, key: bytes) -> bool:
        return self.key_filter is None or self.key_filter(key)

    def get_raw(self, key: bytes) -> bytes | None:
        return self._held().rows.get_raw(key)

    def scan(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to *limit* (key, value) pairs with keys above *after*, ascending."""
        return self._held().rows.scan(after, limit)

    def __len__(self) -> int:
        loaded = self._loaded
        return 0 if loaded is None else len(loaded.rows)

    # --- freshness -----------------------------------------------------------------------------

    @property
    def offsets(self) -> dict[int, int]:
        """The served checkpoint's input offsets (next offset to consume per partition)."""
        loaded = self._loaded
        return dict(loaded.manifest.offsets) if loaded is not None else {}

    @property
    def caught_up(self) -> bool:
        """True once a checkpoint is served: a store is as fresh as its newest checkpoint."""
        return self._loaded is not None

    def lag(self) -> dict[int, int]:
        """Nothing to tail: records past the checkpoint reach the store only through the processor."""
        return dict.fromkeys(self.offsets, 0)

    def newest_record_age(self) -> float | None:
        loaded = self._loaded
        if loaded is None or loaded.rows.newest_ms is None:
            return None
        return max(0.0, datetime.now(UTC).timestamp() - loaded.rows.newest_ms / 1000)

    def wait_for(self, offsets: Mapping[int, int], *, timeout: float) -> bool:
        """Wait until a served checkpoint covers the record at each of *offsets* (a newer
        generation must appear: the processor writes it, this replica polls for it)."""
        deadline = Deadline(timeout)
        with self._changed:
            while not all(self.offsets.get(p, 0) > o for p, o in offsets.items()):
                remaining = deadline.remaining()
                if (remaining is not None and remaining <= 0) or self._state is TaskPhase.FAILED:
                    return False
                self._changed.wait(remaining)
        return True

    def wait_caught_up(self, timeout: float = 30.0) -> bool:
        deadline = Deadline(timeout)
        with self._changed:
            while self._loaded is None:
                remaining = deadline.remaining()
                if (remaining is not None and remaining <= 0) or self._state is TaskPhase.FAILED:
                    return False
                self._changed.wait(remaining)
        return True

    def status(self) -> FollowerStatus:
        loaded = self._loaded
        error = self._error
        return FollowerStatus(
            table=self.store,
            topic=self.topic,
            state=self._state,
            caught_up=self.caught_up,
            offsets=self.offsets,
            lag=self.lag(),
            keys=len(self),
            checkpoint_generation=loaded.manifest.generation if loaded is not None else None,
            restore_seconds=loaded.seconds if loaded is not None else None,
            replayed_records=0,
            last_update_age=None if self._loaded_at is None else time.monotonic() - self._loaded_at,
            newest_record_age=self.newest_record_age(),
            error=None if error is None else f"{type(error).__name__}: {error}",
        )
