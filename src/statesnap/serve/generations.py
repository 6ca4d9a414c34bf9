"""Reads as of a snapshot generation (``?generation=G``): readers loaded on first use, a few kept.

A generation's reader holds the whole table (or store) as generation G holds it, in memory, never
moving: a table's is a :class:`~statesnap.python.follower.Follower` with ``tail=False`` (exactly
what ``dump --generation G --no-tail`` reads), a processor store's is the store's rows read from
G's checkpoint. Loading one costs what a restore costs, so :class:`GenerationCache` loads a
generation once however many requests ask for it at the same time, keeps the ``capacity`` most
recently used ones (memory is the cost: one copy of the table each) and closes the others once no
request is still reading them. Loads run at most ``capacity`` at a time, so memory peaks at twice
the cache. A failed load is not cached: the next request tries again (the store may have been
unreachable a moment).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio.to_thread

from statesnap.blob import BlobStore
from statesnap.checkpoint.discovery import locate_table
from statesnap.errors import GenerationNotFoundError, StatesnapError
from statesnap.processor.readback import StoreCheckpoint, StoreRows

if TYPE_CHECKING:
    from statesnap.python.follower import Follower

__all__ = [
    "DEFAULT_GENERATIONS",
    "DEFAULT_LOAD_SECONDS",
    "GenerationCache",
    "GenerationLoadTimeoutError",
    "GenerationSource",
    "SnapshotReader",
    "StoreAtGeneration",
    "StoreGenerations",
    "TableGenerations",
]

log = logging.getLogger(__name__)

#: Generations kept loaded at once: one copy of the table each.
DEFAULT_GENERATIONS = 2
#: How long a request waits for a generation to load when it gives no ``wait_ms``.
DEFAULT_LOAD_SECONDS = 60.0


class GenerationLoadTimeoutError(StatesnapError, TimeoutError):
    """A generation did not load within the request's deadline (answered 504). The load goes on:
    retry shortly and the generation is served from memory."""

    def __init__(self, generation: int, seconds: float) -> None:
        super().__init__(f"generation {generation} not loaded within {seconds:g} s (still loading; retry)")
        self.generation = generation


class SnapshotReader(Protocol):
    """What a ``?generation=G`` read needs of generation G's state (a table's started ``tail=False``
    :class:`~statesnap.python.follower.Follower` is one as it is: its offsets are G's)."""

    @property
    def offsets(self) -> dict[int, int]: ...

    def get_raw(self, key: bytes) -> bytes | None: ...

    def scan(self, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]: ...

    def keeps(self, key: bytes) -> bool: ...

    def close(self) -> None: ...


class GenerationSource(Protocol):
    """Where readers come from: the generations a table (or processor) has, and one of them
    loaded (blocking; :class:`GenerationNotFoundError` for one not there, the reader's own error
    for one that does not verify — never another generation)."""

    def generations(self) -> list[int]: ...

    def open(self, generation: int) -> SnapshotReader: ...


def _missing(generation: int, held: list[int], what: str, url: str) -> GenerationNotFoundError:
    shown = ", ".join(map(str, sorted(held)[-10:])) or "none"
    return GenerationNotFoundError(
        f"no generation {generation} of {what} in {url} (generations there: {shown})"
    )


@dataclass(frozen=True, slots=True)
class TableGenerations:
    """A table's generations: *follower_at(G)* builds the ``tail=False`` follower of G (the CLI
    passes the options ``serve`` follows the table with); *cluster_id* picks the table's directory
    when several clusters' tables share its name."""

    blob_store: BlobStore
    table: str
    follower_at: Callable[[int], Follower[Any, Any]]
    cluster_id: Callable[[], str | None] = lambda: None

    def generations(self) -> list[int]:
        return locate_table(self.blob_store, self.table, self.cluster_id()).generations()

    def open(self, generation: int) -> SnapshotReader:
        held = self.generations()
        if generation not in held:  # before connecting to Kafka
            raise _missing(generation, held, f"table {self.table!r}", self.blob_store.shown)
        follower = self.follower_at(generation)
        try:
            follower.start()
        except BaseException:
            follower.close()
            raise
        return follower


class StoreAtGeneration(StoreRows):
    """Store *store* of processor *table* as generation G's checkpoint holds it (the rows
    ``dump --store S --generation G`` prints), sorted for scans."""

    __slots__ = ("generation", "offsets")

    def __init__(
        self,
        generation: int,
        offsets: dict[int, int],
        values: dict[bytes, bytes],
        key_filter: Callable[[bytes], bool] | None = None,
    ) -> None:
        super().__init__(values, key_filter=key_filter)
        self.generation = generation
        self.offsets = offsets


@dataclass(frozen=True, slots=True)
class StoreGenerations:
    """A processor store's generations, read from the checkpoint store alone (no broker)."""

    blob_store: BlobStore
    table: str
    store: str
    cluster_id: str | None = None
    key_filter: Callable[[bytes], bool] | None = None

    def generations(self) -> list[int]:
        return locate_table(self.blob_store, self.table, self.cluster_id).generations()

    def open(self, generation: int) -> SnapshotReader:
        held = self.generations()
        if generation not in held:
            raise _missing(generation, held, f"processor {self.table!r}", self.blob_store.shown)
        chosen = StoreCheckpoint.open(
            self.blob_store, self.table, self.store, generation=generation, cluster_id=self.cluster_id
        )
        values, _newest = StoreRows.read(chosen)
        return StoreAtGeneration(generation, dict(chosen.manifest.offsets), values, self.key_filter)


@dataclass(slots=True)
class _Entry:
    generation: int
    reader: SnapshotReader
    leases: int = 0
    evicted: bool = False


def _retrieved(task: asyncio.Task[_Entry]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("generation load failed: %s", task.exception())


class GenerationCache:
    """Generation readers from *source*, loaded on first use, the *capacity* most recently used
    kept. Use from the event loop only (its bookkeeping takes no lock); loads and closes run on
    worker threads."""

    def __init__(self, source: GenerationSource, *, capacity: int = DEFAULT_GENERATIONS) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.source = source
        self.capacity = capacity
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._loading: dict[int, asyncio.Task[_Entry]] = {}
        self._load_slots: asyncio.Semaphore | None = None
        self.loads = 0  # how many loads ran (tests check concurrent requests share one)

    @property
    def loaded(self) -> list[int]:
        """Generations held, least recently used first."""
        return list(self._entries)

    def generations(self) -> list[int]:
        """The generations the source has (blocking: lists the checkpoint store)."""
        return self.source.generations()

    @contextlib.asynccontextmanager
    async def lease(self, generation: int, timeout: float) -> AsyncIterator[SnapshotReader]:
        """Generation *generation*'s reader for the duration of the block; waits at most *timeout*
        seconds for a load (:class:`GenerationLoadTimeoutError`; the load goes on)."""
        entry = self._entries.get(generation)
        if entry is None:
            task = self._loading.get(generation)
            if task is None:
                task = asyncio.get_running_loop().create_task(self._load(generation))
                task.add_done_callback(_retrieved)  # every waiter may have timed out
                self._loading[generation] = task
            try:
                entry = await asyncio.wait_for(asyncio.shield(task), timeout)
            except TimeoutError:
                raise GenerationLoadTimeoutError(generation, timeout) from None
        else:
            self._entries.move_to_end(generation)
        entry.leases += 1
        try:
            yield entry.reader
        finally:
            entry.leases -= 1
            if entry.evicted and entry.leases == 0:
                await self._close(entry)

    async def _load(self, generation: int) -> _Entry:
        if self._load_slots is None:
            self._load_slots = asyncio.Semaphore(self.capacity)
        try:
            async with self._load_slots:
                reader = await anyio.to_thread.run_sync(self.source.open, generation)
                self.loads += 1
            entry = _Entry(generation, reader)
            self._entries[generation] = entry
            log.info("serving generation %d as of its checkpoint", generation)
            await self._evict()
            return entry
        finally:
            self._loading.pop(generation, None)

    async def _evict(self) -> None:
        while len(self._entries) > self.capacity:
            generation, entry = self._entries.popitem(last=False)
            entry.evicted = True
            log.info("generation %d evicted from the cache", generation)
            if entry.leases == 0:
                await self._close(entry)

    @staticmethod
    async def _close(entry: _Entry) -> None:
        try:
            await anyio.to_thread.run_sync(entry.reader.close)
        except Exception as e:  # a reader that fails to close must not fail the answer it served
            log.warning("closing generation %d failed: %s: %s", entry.generation, type(e).__name__, e)

    def close(self) -> None:
        """Close every reader held (at shutdown, once no request runs); loads still running are
        left to finish and be collected with the process."""
        for entry in self._entries.values():
            with contextlib.suppress(Exception):
                entry.reader.close()
        self._entries.clear()
