"""Reproducible sample input for the demo, tests, benchmarks and the README (``produce-sample``).

Two kinds of records:

- a **changelog** (the default): keys ``key-0`` … ``key-<K-1>``, opaque values of a fixed size and
  a fraction of tombstones — what a table materializes;
- **events** (:class:`EventSpec`): JSON values ``{"id": i, "amount": a, "ts": t}`` whose record
  timestamp is the event time ``t`` — what a processor's handlers, aggregations and windows read
  (``record.value["amount"]``) — with, on request, out-of-order and late records, tombstones and
  null keys. Event times end just before now (unless a start is given), so a broker's retention
  keeps them; several topics produced with one spec and the same partition count are
  co-partitioned (the same keys, the same murmur2 partitioner).

The same spec and seed give the same keys, values and (with a fixed start) timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from confluent_kafka import KafkaException

from statesnap.errors import ConfigError, KafkaError
from statesnap.kafka.admin import KafkaAdmin
from statesnap.kafka.clients import new_producer
from statesnap.kafka.config import KafkaSettings

__all__ = ["EventSpec", "SampleRecord", "SampleSpec", "produce_sample", "sample_events", "sample_records"]

_CHUNK = 50_000

#: (key, value, timestamp in ms or None for the producer's clock): one record to produce.
SampleRecord = tuple[bytes | None, bytes | None, int | None]


@dataclass(frozen=True, slots=True)
class EventSpec:
    """Event times and disorder of an event sample.

    Record *i* happens at ``start_ms + i * step_ms`` (plus a jitter below one step), so stream time
    rises; a fraction ``disorder_ratio`` of records is moved back by up to ``max_disorder_ms``
    (out of order, within a window's grace when grace exceeds it), a fraction ``late_ratio`` by
    ``late_by_ms`` or more (late: dropped by a window whose grace is shorter). ``start_ms`` None:
    the last event is about now (:meth:`anchored` fixes it once for several topics)."""

    start_ms: int | None = None
    step_ms: int = 100
    disorder_ratio: float = 0.0
    max_disorder_ms: int = 5_000
    late_ratio: float = 0.0
    late_by_ms: int = 120_000

    def __post_init__(self) -> None:
        if self.step_ms < 1 or self.max_disorder_ms < 1 or self.late_by_ms < 1:
            raise ConfigError("event step, disorder and lateness must be >= 1 ms")
        if self.start_ms is not None and self.start_ms < 0:
            raise ConfigError(f"event start must be >= 0 ms since the epoch, got {self.start_ms}")
        for name in ("disorder_ratio", "late_ratio"):
            ratio = getattr(self, name)
            if not 0.0 <= ratio <= 1.0:
                raise ConfigError(f"{name.replace('_', ' ')} must be within [0, 1], got {ratio}")
        if self.disorder_ratio + self.late_ratio > 1.0:
            raise ConfigError("disorder ratio and late ratio must add up to at most 1")

    def anchored(self, updates: int, now_ms: int | None = None) -> EventSpec:
        """This spec with its start fixed: given, or so that *updates* events end about now."""
        if self.start_ms is not None:
            return self
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return replace(self, start_ms=max(0, now - updates * self.step_ms))


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """U records over keys ``key-0`` … ``key-<K-1>``; a fraction of them tombstones, a fraction
    with a null key; values opaque bytes of ``value_bytes``, or JSON events when *events* is set."""

    topic: str
    partitions: int = 8
    keys: int = 1000
    updates: int = 10_000
    tombstone_ratio: float = 0.0
    value_bytes: int = 100
    seed: int = 0
    events: EventSpec | None = None
    null_key_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.keys < 1 or self.updates < 0 or self.value_bytes < 1:
            raise ConfigError("partitions, keys and value-bytes must be >= 1 and updates >= 0")
        if not 0.0 <= self.tombstone_ratio <= 1.0:
            raise ConfigError(f"tombstone ratio must be within [0, 1], got {self.tombstone_ratio}")
        if not 0.0 <= self.null_key_ratio <= 1.0:
            raise ConfigError(f"null-key ratio must be within [0, 1], got {self.null_key_ratio}")


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


def sample_events(spec: SampleSpec, start: int = 0, count: int | None = None) -> list[SampleRecord]:
    """Events ``start`` … ``start+count`` of the sample *spec* describes (deterministic once its
    events' start is fixed: see :meth:`EventSpec.anchored`)."""
    if spec.events is None:
        raise ConfigError("sample_events needs a SampleSpec with events")
    events = spec.events.anchored(spec.updates)
    assert events.start_ms is not None
    count = spec.updates - start if count is None else count
    rng = np.random.default_rng([spec.seed, start, 1])
    key_ids = rng.integers(0, spec.keys, size=count).tolist()
    amounts = rng.integers(1, 100, size=count).tolist()
    jitter = rng.integers(0, events.step_ms, size=count).tolist()
    fate = rng.random(count).tolist()
    back = rng.random(count).tolist()
    dead = (rng.random(count) < spec.tombstone_ratio).tolist()
    keyless = (rng.random(count) < spec.null_key_ratio).tolist()
    disorder, late = events.disorder_ratio, events.disorder_ratio + events.late_ratio
    out: list[SampleRecord] = []
    for j in range(count):
        i = start + j
        ts = events.start_ms + i * events.step_ms + jitter[j]
        if fate[j] < disorder:
            ts -= 1 + int(back[j] * (events.max_disorder_ms - 1))
        elif fate[j] < late:
            ts -= events.late_by_ms + int(back[j] * events.late_by_ms)
        ts = max(0, ts)
        key = None if keyless[j] else b"key-%d" % key_ids[j]
        value = None if dead[j] else b'{"id": %d, "amount": %d, "ts": %d}' % (i, amounts[j], ts)
        out.append((key, value, ts))
    return out


def _records(spec: SampleSpec, start: int, count: int) -> list[SampleRecord]:
    if spec.events is not None:
        return sample_events(spec, start, count)
    rng = np.random.default_rng([spec.seed, start, 2])
    keyless = (rng.random(count) < spec.null_key_ratio).tolist() if spec.null_key_ratio else None
    return [
        (None if keyless is not None and keyless[j] else key, value, None)
        for j, (key, value) in enumerate(sample_records(spec, start, count))
    ]


def produce_sample(
    settings: KafkaSettings,
    spec: SampleSpec,
    *,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Create the topic if missing and append the sample (events with their event times as record
    timestamps); returns the records produced. An event spec without a start ends about now."""
    if spec.events is not None:
        spec = replace(spec, events=spec.events.anchored(spec.updates))
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
            batch = _records(spec, start, min(_CHUNK, spec.updates - start))
            for key, value, ts in batch:
                extra = {} if ts is None else {"timestamp": ts}
                while True:
                    try:
                        producer.produce(spec.topic, value, key, on_delivery=on_delivery, **extra)
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
