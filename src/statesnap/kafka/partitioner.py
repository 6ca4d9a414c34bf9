"""Which partition a producer writes a key to: the partitioners of Kafka's clients, in Python.

A member of a consumer group holds only its partitions' rows; to tell "this key does not exist"
from "this key lives in a partition another member owns" it must know the producer's partitioner.

- ``murmur2_random`` (the default): the Java client's default partitioner (also Kafka Streams and
  statesnap's own sample producer) — ``(murmur2(key) & 0x7fffffff) % partitions``.
- ``consistent_random``: librdkafka's default (confluent-kafka, Go, .NET clients) —
  ``crc32(key) % partitions``.
- any callable ``(key_bytes, partition_count) -> partition``, for custom partitioners.

The ``_random`` suffix only concerns records without a key, which a table ignores; ``murmur2``
and ``consistent`` are accepted as the same partitioners.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Literal

from statesnap.errors import ConfigError

__all__ = ["PartitionerName", "PartitionerSpec", "murmur2", "resolve_partitioner"]

PartitionerName = Literal["murmur2_random", "murmur2", "consistent_random", "consistent"]
#: A partitioner by name, or a function of (key bytes, partition count).
PartitionerSpec = PartitionerName | Callable[[bytes, int], int]
Partitioner = Callable[[bytes, int], int]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    extra = length & 3
    if extra == 3:
        h ^= data[end + 2] << 16
    if extra >= 2:
        h ^= data[end + 1] << 8
    if extra >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def _murmur2_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def _crc32_partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


_BY_NAME: dict[str, Partitioner] = {
    "murmur2_random": _murmur2_partition,
    "murmur2": _murmur2_partition,
    "consistent_random": _crc32_partition,
    "consistent": _crc32_partition,
}


def resolve_partitioner(spec: PartitionerSpec) -> Partitioner:
    """The partition function for *spec*; :class:`ConfigError` for an unknown name."""
    if callable(spec):
        return spec
    try:
        return _BY_NAME[spec]
    except KeyError:
        raise ConfigError(
            f"unknown partitioner {spec!r}; choose one of {', '.join(sorted(_BY_NAME))} or pass a function"
        ) from None
