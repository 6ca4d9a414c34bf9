"""How many records a materialization would read: an estimate for choosing an engine.

The end of each partition comes from its high watermark, which the dev broker under-reports.
Apache Kafka's is an exact end *offset*, yet still no exact count of *records*: transaction
markers take offsets, aborted records are skipped by a read_committed replay, compaction and
retention leave holes (tests/integration/apache/test_progress_totals.py). So the number is
labelled an estimate wherever it is shown, on every broker, and nothing correctness-related ever
depends on it (catch-up is decided by partition EOF).
"""

from __future__ import annotations

from collections.abc import Mapping

from statesnap.kafka.admin import watermark_offsets
from statesnap.kafka.config import KafkaSettings

__all__ = ["estimate_backlog", "high_watermarks"]


def high_watermarks(settings: KafkaSettings, topic: str, partitions: tuple[int, ...]) -> dict[int, int]:
    """The broker's reported end per partition (low-cost; may under-report, see module doc)."""
    return {p: high for p, (_low, high) in watermark_offsets(settings, topic, partitions).items()}


def estimate_backlog(ends: Mapping[int, int], starts: Mapping[int, int]) -> int:
    """Records between *starts* (a checkpoint's offsets; 0 where none) and *ends*."""
    return sum(max(0, end - starts.get(p, 0)) for p, end in ends.items())
