"""Helpers for integration tests on the real broker and the moto S3 server.

The session services (``broker``, ``s3_server``) and per-test names come from tests/conftest.py.
This file adds the ``kafka`` fixture, a :class:`KafkaTool` that produces to explicit partitions
and reads a topic back with a plain consumer. That gives every test an *independent* ground
truth: a dict per key, last write wins, a tombstone deletes, computed from the records the broker
acknowledged and never by statesnap itself.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported without __all__

from statesnap import Table
from statesnap.devstack import ApacheKafkaBroker, EmbeddedBroker
from statesnap.digest import table_digest


@dataclass(frozen=True, slots=True)
class Rec:
    """One record as the broker stored it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class KafkaTool:
    """Admin, producer and plain consumer on the session broker, plus the ground-truth model.

    :meth:`close` destroys its clients, whoever still holds the tool: a client that outlives its
    broker reconnects and prints "Connection refused" after the last test."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None

    # --- broker side ---------------------------------------------------------------------------

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                {"bootstrap.servers": self.bootstrap, "allow.auto.create.topics": False}
            )
        return self._admin

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "linger.ms": 2,
                    "acks": "all",
                    "enable.idempotence": False,
                    # One request in flight: a retry (a new topic's first produce may meet
                    # "not leader yet") can then never reorder a partition's records; a test
                    # that wrote a key twice read the older value once.
                    "max.in.flight.requests.per.connection": 1,
                }
            )
        return self._producer

    def create_topic(self, name: str, partitions: int, config: Mapping[str, str] | None = None) -> str:
        """Create *name* and wait until metadata shows every partition. Time retention is off unless
        *config* sets it: tests write records with fixed timestamps years in the past, which a
        broker that applies retention (Apache Kafka, 7 days by default) deletes within its check
        interval, active segment included."""
        settings = {"retention.ms": "-1", **dict(config or {})}
        fut = self.admin.create_topics([NewTopic(name, partitions, 1, config=settings)])
        fut[name].result(15)
        deadline = time.monotonic() + 10
        while True:  # wait until metadata shows every partition
            md = self.admin.list_topics(topic=name, timeout=5).topics.get(name)
            if md is not None and md.error is None and len(md.partitions) == partitions:
                return name
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {name} did not appear with {partitions} partitions")
            time.sleep(0.05)

    def topic_exists(self, name: str) -> bool:
        return name in self.admin.list_topics(timeout=5).topics

    def produce(self, topic: str, records: Iterable[tuple[int, bytes | None, bytes | None]]) -> list[Rec]:
        """Produce (partition, key, value) records in order; returns them with their offsets."""
        delivered: list[Rec] = []
        errors: list[str] = []

        def on_delivery(err: object, msg: object) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                delivered.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value()))  # type: ignore[attr-defined]

        n = 0
        for partition, key, value in records:
            while True:
                try:
                    self.producer.produce(topic, value, key, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            n += 1
            if n % 1000 == 0:
                self.producer.poll(0)
        assert self.producer.flush(30) == 0, "records left undelivered"
        assert not errors, errors
        assert len(delivered) == n
        return sorted(delivered, key=lambda r: (r.partition, r.offset))

    def read_all(self, topic: str, partitions: Iterable[int], timeout: float = 30) -> list[Rec]:
        """Every record still in *topic* (from each log start, which retention may have moved), read
        with a plain consumer until EOF on each partition
        (never from the high watermark, which the dev broker under-reports)."""
        parts = set(partitions)
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "test-truth",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
            }
        )
        try:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(parts)])
            eof: set[int] = set()
            out: list[Rec] = []
            deadline = time.monotonic() + timeout
            while eof != parts:
                assert time.monotonic() < deadline, f"reading {topic} timed out"
                for m in c.consume(1000, 0.1):
                    err, partition, offset = m.error(), m.partition(), m.offset()
                    if err is not None:
                        if err.code() == RdKafkaError._PARTITION_EOF:
                            assert partition is not None, "an EOF event names its partition"
                            eof.add(partition)
                        continue
                    assert partition is not None, "a record names its partition"
                    assert offset is not None, "a record has an offset"
                    eof.discard(partition)
                    out.append(Rec(partition, offset, m.key(), m.value()))
            return sorted(out, key=lambda r: (r.partition, r.offset))
        finally:
            c.close()

    def close(self) -> None:
        """Deliver what is pending, then drop both clients (librdkafka destroys them on release)."""
        if self._producer is not None:
            self._producer.flush(10)
        self._producer = None
        self._admin = None

    # --- the model -----------------------------------------------------------------------------

    @staticmethod
    def truth(records: Iterable[Rec]) -> dict[bytes, bytes]:
        """The table a full replay must produce, by the definition of a KTable."""
        table: dict[bytes, bytes] = {}
        for r in sorted(records, key=lambda r: (r.partition, r.offset)):
            if r.key is None:
                continue  # keyless records belong to no row
            if r.value is None:
                table.pop(r.key, None)
            else:
                table[r.key] = r.value
        return table

    @staticmethod
    def end_offsets(records: Iterable[Rec], partitions: Iterable[int]) -> dict[int, int]:
        """Next offset to consume per partition after *records* (0 for an empty partition)."""
        out = dict.fromkeys(partitions, 0)
        for r in records:
            out[r.partition] = max(out[r.partition], r.offset + 1)
        return out

    # --- driving tables ------------------------------------------------------------------------

    @staticmethod
    def drain(table: Table, offsets: Mapping[int, int], timeout: float = 30.0) -> None:
        """Poll a ``background=False`` table until it applied everything below *offsets*."""
        deadline = time.monotonic() + timeout
        while any(table.offsets.get(p, 0) < off for p, off in offsets.items()):
            assert time.monotonic() < deadline, f"table stuck at {table.offsets}, want {offsets}"
            table.poll(0.05)

    @staticmethod
    def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)


def frames_of(error: BaseException) -> Iterator[types.FrameType]:
    """Every frame the tracebacks of *error* and of the exceptions it chains hold (what a kept
    error keeps alive through their locals)."""
    chained: BaseException | None = error
    while chained is not None:
        tb = chained.__traceback__
        while tb is not None:
            yield tb.tb_frame
            tb = tb.tb_next
        chained = chained.__cause__ or chained.__context__


def restored_digest(topic: str, bootstrap_servers: str, **options: Any) -> tuple[str, int]:
    """Digest and key count of the table a one-shot ``Table(topic, **options)`` restores (it never
    writes a checkpoint)."""
    t: Table[bytes, bytes] = Table(topic, bootstrap_servers=bootstrap_servers, background=False, **options)
    t.start()
    try:
        return table_digest(t.raw_items())
    finally:
        t.close(checkpoint=False)


@pytest.fixture(scope="session")
def kafka(kafka_broker: EmbeddedBroker | ApacheKafkaBroker) -> Iterator[KafkaTool]:
    tool = KafkaTool(kafka_broker.bootstrap_servers)
    yield tool
    tool.close()


@pytest.fixture(autouse=True)
def _shared_spark_session_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that stopped the suite's one SparkSession (a helper that stops the session it was
    given or found, say) fails here, by name, instead of every later Spark test failing."""
    yield
    # What the test was given as `spark` (a parameter of that name is a bool, not a session).
    session: Any = getattr(request.node, "funcargs", {}).get("spark")
    if session is not None and hasattr(session, "sparkContext") and session.sparkContext._jsc is None:
        pytest.fail(
            "this test stopped the suite's shared SparkSession: pass the session to what it runs "
            "(as diff_on_spark(spark=...)) instead of letting it start and stop its own"
        )
