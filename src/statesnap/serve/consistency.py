"""What an answer reads: the live replica once ready and as fresh as the caller demands
(``min_offsets``, ``caught_up``), or generation G's state (``generation``), never moving — and the
HTTP answer when it cannot (404 listing the generations there are, 500 for one that does not
verify, 503 while the store is unreachable, 504 past ``wait_ms``).

:func:`reads_dependency` builds the FastAPI dependency every table read goes through.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the dependency's signature at
# runtime, and its query parameters' bounds and descriptions come from reads_dependency()'s
# arguments.
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio.to_thread
from fastapi import HTTPException, Query, Request

from statesnap.errors import (
    CheckpointError,
    ConfigError,
    GenerationNotFoundError,
    StatesnapError,
    TableNotFoundError,
)
from statesnap.redaction import scrub
from statesnap.serve.generations import GenerationCache, GenerationLoadTimeoutError
from statesnap.serve.headers import Freshness, SnapshotFreshness, record
from statesnap.serve.params import ParameterError, parse_min_offsets
from statesnap.serve.rows import Reads
from statesnap.serve.waits import FreshnessWaits, ServedReplica

__all__ = ["reads_dependency", "require_table"]


def require_table(follower: ServedReplica, table: str) -> None:
    """404 unless *table* is the one this server follows."""
    if table != follower.name:
        raise HTTPException(404, f"no table {table!r} here; this server follows {follower.name!r}")


def _require_running(follower: ServedReplica) -> None:
    state = follower.state
    if state != "running":
        raise HTTPException(
            503, f"table {follower.name!r} is {state}, not ready for reads", headers={"Retry-After": "1"}
        )


def _held(generations: GenerationCache) -> list[int]:
    """The generations there are, oldest first, for a 404; empty when even the listing fails."""
    try:
        return sorted(generations.generations())
    except StatesnapError:
        return []


@contextlib.asynccontextmanager
async def _generation_read(
    generations: GenerationCache | None, generation: int, request: Request, timeout: float
) -> AsyncIterator[Reads]:
    """Generation *generation*'s reader, loaded (or taken from the cache) for one answer."""
    if generations is None:
        raise HTTPException(400, "generation reads are off on this server (serve --max-generations 0)")
    try:
        async with generations.lease(generation, timeout) as reader:
            record(request, SnapshotFreshness(generation, reader.offsets))
            yield reader
    except (GenerationNotFoundError, TableNotFoundError) as e:
        held = await anyio.to_thread.run_sync(_held, generations)
        detail = {"message": scrub(str(e)), "generation": generation, "generations": held}
        raise HTTPException(404, detail) from None
    except CheckpointError as e:  # does not verify: the error, never another generation
        detail = {
            "message": f"generation {generation} cannot be read: {type(e).__name__}: {scrub(str(e))}",
            "generation": generation,
        }
        raise HTTPException(500, detail) from None
    except (ConfigError, GenerationLoadTimeoutError):
        raise  # 400 / 504 by their handlers
    except StatesnapError as e:  # the store or the cluster unreachable a moment: retry
        why = f"{type(e).__name__}: {scrub(str(e))}"
        detail = {
            "message": f"generation {generation} could not be loaded: {why}",
            "generation": generation,
        }
        raise HTTPException(503, detail, headers={"Retry-After": "1"}) from None


def reads_dependency(
    follower: ServedReplica,
    *,
    waits: FreshnessWaits,
    generations: GenerationCache | None,
    default_wait_ms: int,
    max_wait_ms: int,
    load_timeout_ms: int,
) -> Callable[..., AsyncIterator[Reads]]:
    """The dependency a table read declares (``Annotated[Reads, Depends(...)]``): its query
    parameters, documented in the OpenAPI document, and what the answer reads."""

    async def consistency(
        request: Request,
        table: str,
        generation: Annotated[
            int | None,
            Query(
                ge=0,
                description="Read as of this snapshot generation: exactly the state its checkpoint "
                "holds, never moving (X-Statesnap-Generation and X-Statesnap-Offsets say which). "
                "404 lists the generations there are; not with min_offsets or caught_up.",
            ),
        ] = None,
        min_offsets: Annotated[
            str | None,
            Query(
                description='Partition → offset of a record you wrote, as JSON ({"0": 123}) or as '
                "0:123,3:9; the answer waits until every such record is applied (read-your-writes).",
                examples=['{"0": 123}', "0:123"],
            ),
        ] = None,
        caught_up: Annotated[
            bool, Query(description="Wait until every partition is at end-of-partition.")
        ] = False,
        wait_ms: Annotated[
            int | None,
            Query(
                ge=0,
                le=max_wait_ms,
                description=f"How long to wait for min_offsets / caught_up (default {default_wait_ms}) "
                f"or for a generation to load (default {load_timeout_ms}); then 504.",
            ),
        ] = None,
    ) -> AsyncIterator[Reads]:
        """Table check, then what the answer reads: generation G's state, or the live replica
        once ready and as fresh as the caller demands; records what the answer will reflect for
        the headers."""
        require_table(follower, table)
        if generation is not None:
            if min_offsets is not None or caught_up:
                raise HTTPException(
                    400,
                    f"generation {generation} is a snapshot: it does not move, so min_offsets and "
                    "caught_up do not go with generation",
                )
            timeout = (load_timeout_ms if wait_ms is None else wait_ms) / 1000
            async with _generation_read(generations, generation, request, timeout) as reader:
                yield reader
            return
        _require_running(follower)
        waited = default_wait_ms if wait_ms is None else wait_ms
        timeout = waited / 1000
        if min_offsets is not None:
            try:
                wanted = parse_min_offsets(min_offsets)
            except ParameterError as e:
                raise HTTPException(400, str(e)) from None
            if wanted and not await waits.offsets(wanted, timeout):
                raise HTTPException(
                    504,
                    {
                        "message": f"min_offsets not applied within {waited} ms",
                        "wanted": {str(p): o for p, o in wanted.items()},
                        "offsets": {str(p): o for p, o in follower.offsets.items()},
                    },
                )
        if caught_up and not await waits.caught_up(timeout):
            raise HTTPException(504, f"not caught up within {waited} ms")
        record(request, Freshness.of(follower))
        yield follower

    return consistency
