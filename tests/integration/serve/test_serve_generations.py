"""``serve ?generation=G``: reads as of a snapshot generation, over real HTTP, against the real
broker (Apache Kafka, the suite's broker, and Tansu proved these: nothing here depends on broker behaviour
beyond ordered partitions and partition EOF) and both blob stores (a table's checkpoints on the moto S3
server, a processor's on a filesystem).

The ground truth of each generation is computed from the broker's delivery reports of the records
below that generation's offsets, independently of statesnap.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from integration.cli_runner import STATESNAP
from integration.conftest import KafkaTool
from integration.processor.test_store_readback import recompute, write_history
from integration.test_serve import PARTITIONS, BlockedRestore, records, scan_all
from statesnap import CheckpointOptions, Table
from statesnap.blob import open_blob_store
from statesnap.checkpoint.discovery import locate_table
from statesnap.python.follower import Follower
from statesnap.serve import HttpServer, create_app
from statesnap.serve.generations import GenerationCache, TableGenerations

pytestmark = pytest.mark.integration


def checkpoint_batch(kafka: KafkaTool, topic: str, s3: Any, produced: list[Any], n: int, seed: int) -> None:
    """Produce *n* more records and let the owner checkpoint everything so far (one generation)."""
    produced.extend(kafka.produce(topic, records(random.Random(seed), n, tag=f"s{seed}-")))
    owner = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=CheckpointOptions(s3.url, storage_options=s3.options),
        background=False,
    )
    owner.start()
    assert owner.checkpoint() is not None
    owner.close(checkpoint=False)


def below(produced: list[Any], offsets: dict[int, int]) -> dict[bytes, bytes]:
    """The table of the records below *offsets* (a generation's), from the delivery reports."""
    return KafkaTool.truth(r for r in produced if r.offset < offsets.get(r.partition, 0))


def test_table_reads_as_of_each_generation_while_the_replica_tails(
    kafka: KafkaTool, s3_location: Any
) -> None:
    """Two generations on S3 and more records after them: the live replica answers the newest
    state, ``?generation=G`` exactly G's (lookups, paged scans whose ``next`` keeps G), with G in
    ``X-Statesnap-Generation`` and G's offsets in ``X-Statesnap-Offsets``. Eight concurrent first
    reads of a generation load it once; with one slot, reading the other generation evicts it.
    An unknown generation is a 404 listing the ones there are; ``min_offsets`` with a generation a
    400; a load slower than ``wait_ms`` a 504 naming the generation (the load goes on)."""
    topic = kafka.create_topic(f"gen-{uuid.uuid4().hex[:12]}", PARTITIONS)
    produced: list[Any] = []
    checkpoint_batch(kafka, topic, s3_location, produced, 400, seed=1)
    checkpoint_batch(kafka, topic, s3_location, produced, 400, seed=2)
    produced.extend(kafka.produce(topic, records(random.Random(3), 300, tag="live-")))

    blobs = open_blob_store(s3_location.url, **s3_location.options)
    repo = locate_table(blobs, topic)
    assert repo.generations() == [2, 1]
    offsets = {g: repo.read_manifest(g).offsets for g in (1, 2)}
    truth = {g: below(produced, offsets[g]) for g in (1, 2)}
    assert truth[1] != truth[2] != KafkaTool.truth(produced)

    gate = BlockedRestore(blobs)  # generation loads read through it: the test can hold one
    gate.release.set()

    def follower_at(generation: int | None) -> Follower[Any, Any]:
        if generation is None:
            options = CheckpointOptions(s3_location.url, storage_options=s3_location.options)
        else:
            options = CheckpointOptions(gate, generation=generation)
        return Follower(
            topic, bootstrap_servers=kafka.bootstrap, checkpoints=options, tail=generation is None
        )

    live = follower_at(None)
    cache = GenerationCache(TableGenerations(blobs, topic, follower_at), capacity=1)
    server = HttpServer(create_app(live, generations=cache)).start()
    live.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:

            async def first_reads() -> list[httpx.Response]:
                async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                    key = quote(next(iter(truth[1])), safe="")
                    calls = [client.get(f"/tables/{topic}/keys/{key}?generation=1") for _ in range(8)]
                    return list(await asyncio.gather(*calls))

            answers = asyncio.run(first_reads())
            assert {(r.status_code, r.content) for r in answers} == {(200, next(iter(truth[1].values())))}
            assert cache.loads == 1

            for g in (1, 2):
                r = http.get(f"/tables/{topic}/keys?limit=7&generation={g}")
                assert r.headers["x-statesnap-generation"] == str(g)
                assert json.loads(r.headers["x-statesnap-offsets"]) == {
                    str(p): o for p, o in offsets[g].items()
                }
                assert "generation=" in r.json()["next"]
                assert scan_all_at(http, topic, g) == truth[g]
                for key, value in list(truth[g].items())[:20]:
                    r = http.get(f"/tables/{topic}/keys/{quote(key, safe='')}", params={"generation": g})
                    assert (r.status_code, r.content) == (200, value)
                assert cache.loaded == [g]  # one slot: reading 2 evicted (and closed) 1
            assert cache.loads == 2

            assert live.wait_caught_up(60)
            assert scan_all(http, topic, 500) == KafkaTool.truth(produced)

            r = http.get(f"/tables/{topic}/keys/key-001", params={"generation": 7})
            assert r.status_code == 404
            assert r.json()["detail"]["generations"] == [1, 2]
            assert "no generation 7" in r.json()["detail"]["message"]
            r = http.get(f"/tables/{topic}/keys/key-001", params={"generation": 1, "min_offsets": "0:1"})
            assert r.status_code == 400
            assert "does not move" in r.json()["detail"]

            gate.release.clear()  # a load that takes longer than the request waits: 504 naming it
            r = http.get(f"/tables/{topic}/keys/key-001", params={"generation": 1, "wait_ms": 300})
            assert r.status_code == 504, r.text
            assert r.json()["generation"] == 1
            assert "generation 1 not loaded within 0.3 s" in r.json()["detail"]
            gate.release.set()
            r = http.get(f"/tables/{topic}/keys", params={"generation": 1})
            assert r.headers["x-statesnap-generation"] == "1"
            assert cache.loads == 3  # the timed-out load went on and served this read

            spec = http.get("/openapi.json").json()
            params = spec["paths"]["/tables/{table}/keys/{key}"]["get"]["parameters"]
            assert any(p["name"] == "generation" for p in params)
    finally:
        server.stop()
        live.close()
        cache.close()


def scan_all_at(http: httpx.Client, table: str, generation: int) -> dict[bytes, bytes]:
    """Every row of *generation* through the paged scan (``next`` carries the generation)."""
    out: dict[bytes, bytes] = {}
    url: str | None = f"/tables/{table}/keys?limit=50&generation={generation}"
    while url is not None:
        r = http.get(url)
        assert r.status_code == 200, r.text
        assert r.headers["x-statesnap-generation"] == str(generation)
        out.update({i["key"].encode(): i["value"].encode() for i in r.json()["items"]})
        url = r.json()["next"]
    return out


@pytest.fixture
def served() -> Iterator[list[subprocess.Popen[str]]]:
    children: list[subprocess.Popen[str]] = []
    yield children
    for child in children:
        child.terminate()
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(10)


def test_serve_store_command_reads_each_generation_and_refuses_a_corrupt_one(
    kafka: KafkaTool, topic_name: str, tmp_path: Path, served: list[subprocess.Popen[str]]
) -> None:
    """``statesnap serve --store`` in its own process, a processor's checkpoints on a filesystem:
    ``?generation=1`` answers the store as the first 200 payments left it while the server serves
    generation 2; once its manifest is corrupted (and it was evicted), it answers 500 naming it —
    never another generation; an unknown one 404 listing the generations there are."""
    url = str(tmp_path / "ckpt")
    write_history(kafka, topic_name, url, (200, 100))
    child = subprocess.Popen(
        [
            *STATESNAP,
            "serve",
            "--table",
            "tally",
            "--store",
            "balances",
            "-c",
            url,
            "--port",
            "0",
            "--max-generations",
            "1",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    served.append(child)
    assert child.stderr is not None
    found = re.search(r"on (http://\S+) ", child.stderr.readline())
    assert found
    with httpx.Client(base_url=found.group(1), timeout=30) as http:
        old, _ = recompute(kafka, topic_name, upto=200)
        new, _ = recompute(kafka, topic_name)
        for g, balances in ((1, old), (2, new)):
            r = http.get("/tables/balances/keys", params={"generation": g, "limit": 100})
            assert r.status_code == 200, r.text
            assert r.headers["x-statesnap-generation"] == str(g)
            assert {i["key"]: json.loads(i["value"]) for i in r.json()["items"]} == balances
        assert http.get("/tables/balances/keys/acct-3", params={"generation": 1}).json() == old["acct-3"]

        repo = locate_table(open_blob_store(url), "tally")
        manifest = Path(url) / repo.directory / "snapshots" / f"{1:020d}.json"
        manifest.write_bytes(b"{not a manifest")
        # Generation 1 is still loaded: reading 2 evicts it (one slot), and its next read loads it.
        assert http.get("/tables/balances/keys/acct-3", params={"generation": 2}).status_code == 200
        r = http.get("/tables/balances/keys/acct-3", params={"generation": 1})
        assert r.status_code == 500, r.text
        assert r.json()["detail"]["generation"] == 1
        assert "generation 1" in r.json()["detail"]["message"]
        r = http.get("/tables/balances/keys/acct-3", params={"generation": 9})
        assert r.status_code == 404
        assert r.json()["detail"]["generations"] == [1, 2]
    child.terminate()
    assert child.wait(20) == 0
