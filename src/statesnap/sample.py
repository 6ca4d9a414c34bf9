"""A reproducible changelog generator for the demo, tests and benchmarks (``produce-sample``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from confluent_kafka import KafkaException

from statesnap.errors import ConfigError, KafkaError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.clients import new_producer
from statesnap.kafka.config import KafkaSettings

__all__ = ["SampleSpec", "produce_sample", "sample_records"]

_CHUNK = 50_000


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """U records over keys ``key-0`` … ``key-<K-1>``; a fraction of them tombstones."""

    topic: str
    partitions: int = 8
    keys: int = 1000
    updates: int = 10_000
    tombstone_ratio: float = 0.0
    value_bytes: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.keys < 1 or self.updates < 0 or self.value_bytes < 1:
            raise ConfigError("partitions, keys and value-bytes must be >= 1 and updates >= 0")
        if not 0.0 <= self.tombstone_ratio <= 1.0:
            raise ConfigError(f"tombstone ratio must be within [0, 1], got {self.tombstone_ratio}")


def sample_records(
    spec: SampleSpec, start: int = 0, count: int | None = None
) -> list[tuple[bytes, bytes | None]]:
    """Records ``start`` … ``start+count`` of the changelog *spec* describes (deterministic)."""
    count = spec.updates - start if count is None else count
    rng = np.random.default_rng([spec.seed, start])
    key_ids = rng.integers(0, spec.keys, size=count)
    dead = rng.random(count) < spec.tombstone_ratio
    pad = b"x" * spec.value_bytes
    out: list[tuple[bytes, bytes | None]] = []
    for i, (kid, is_dead) in enumerate(zip(key_ids.tolist(), dead.tolist(), strict=True)):
        key = b"key-%d" % kid
        out.append((key, None if is_dead else (b"%d:%d:" % (spec.seed, start + i) + pad)[: spec.value_bytes]))
    return out


def produce_sample(
    settings: KafkaSettings,
    spec: SampleSpec,
    *,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Create the topic if missing and append the changelog; returns the records produced."""
    KafkaAdmin(settings).create_topic(spec.topic, spec.partitions)
    producer = new_producer(
        settings,
        **{
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "partitioner": "murmur2_random",
            "enable.idempotence": False,
            "acks": "all",
        },
    )
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    produced = 0
    try:
        for start in range(0, spec.updates, _CHUNK):
            batch = sample_records(spec, start, min(_CHUNK, spec.updates - start))
            for key, value in batch:
                while True:
                    try:
                        producer.produce(spec.topic, value, key, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
            produced += len(batch)
            if errors:
                raise KafkaError(f"producing to {spec.topic!r} failed: {errors[0]}")
            if progress is not None:
                progress(len(batch))
        remaining = producer.flush(60)
    except KafkaException as e:
        raise KafkaError(f"producing to {spec.topic!r}: {e}") from e
    if remaining or errors:
        raise KafkaError(
            f"producing to {spec.topic!r}: {remaining} records undelivered"
            + (f" ({errors[0]})" if errors else "")
        )
    return produced
