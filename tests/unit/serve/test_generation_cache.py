"""The generation cache of ``serve ?generation=G`` on a fake source (no services): one load for
concurrent first reads, LRU eviction that closes a reader only once no read still holds it, a load
deadline that names the generation, failed loads not cached. The real reads are proven end to end
in tests/integration/serve/test_serve_generations.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from statesnap.errors import CorruptCheckpointError
from statesnap.serve.generations import GenerationCache, GenerationLoadTimeoutError, StoreAtGeneration


class FakeSource:
    """Generations 1..3; each open counts, may block until released, may fail."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.closed: list[int] = []
        self.release = threading.Event()
        self.release.set()
        self.fail: set[int] = set()

    def generations(self) -> list[int]:
        return [3, 2, 1]

    def open(self, generation: int) -> StoreAtGeneration:
        assert self.release.wait(10)
        self.opened.append(generation)
        if generation in self.fail:
            raise CorruptCheckpointError(f"generation {generation}: checksum mismatch")
        source = self

        class Reader(StoreAtGeneration):
            def close(self) -> None:
                source.closed.append(self.generation)

        return Reader(generation, {0: generation * 10}, {b"k": b"%d" % generation})


def test_concurrent_first_reads_load_once_and_lru_closes_after_the_last_read() -> None:
    source = FakeSource()
    cache = GenerationCache(source, capacity=1)

    async def scenario() -> None:
        source.release.clear()

        async def read(gen: int) -> bytes | None:
            async with cache.lease(gen, 5) as reader:
                return reader.get_raw(b"k")

        waiting = [asyncio.create_task(read(1)) for _ in range(8)]
        await asyncio.sleep(0.05)
        source.release.set()
        assert await asyncio.gather(*waiting) == [b"1"] * 8
        assert source.opened == [1]

        async with cache.lease(1, 5) as held:  # a read still in progress on generation 1 ...
            async with cache.lease(2, 5) as other:  # ... when generation 2 evicts it
                assert other.offsets == {0: 20}
            assert cache.loaded == [2]
            assert source.closed == []  # not closed under the read
            assert held.get_raw(b"k") == b"1"
        assert source.closed == [1]  # closed once the read ended

    asyncio.run(scenario())
    cache.close()
    assert source.closed == [1, 2]


def test_a_slow_load_times_out_naming_its_generation_and_a_failed_one_is_not_cached() -> None:
    source = FakeSource()
    cache = GenerationCache(source, capacity=2)

    async def scenario() -> None:
        source.release.clear()
        with pytest.raises(GenerationLoadTimeoutError, match=r"generation 3 not loaded within 0\.05 s"):
            async with cache.lease(3, 0.05):
                pass
        source.release.set()
        async with cache.lease(3, 5) as reader:  # the load went on: this read shares it
            assert reader.offsets == {0: 30}  # generation 3's
        assert source.opened == [3]

        source.fail.add(2)
        for _ in range(2):
            with pytest.raises(CorruptCheckpointError, match="generation 2"):
                async with cache.lease(2, 5):
                    pass
        assert source.opened == [3, 2, 2]  # tried again, never another generation served
        assert cache.loaded == [3]

    asyncio.run(scenario())


def test_the_cli_repeats_the_cache_default() -> None:
    """The CLI repeats the default so that loading it does not import FastAPI; they must agree."""
    from statesnap.cli import serve as cli_serve
    from statesnap.serve import generations

    assert cli_serve.DEFAULT_GENERATIONS == generations.DEFAULT_GENERATIONS
    load_option = next(p for p in cli_serve.serve.params if p.name == "generation_load_timeout")
    assert load_option.default == f"{generations.DEFAULT_LOAD_SECONDS:g}s"
