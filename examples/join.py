"""A windowed stream–stream join: each ad click joined with the impressions of the same ad in the
10 minutes before it, whichever of the two arrives first — the built-in join, with Kafka Streams'
``JoinWindows`` semantics (see :mod:`statesnap.processor.joins`).

Impressions (``ad-impressions``) and clicks (``ad-clicks``) are two co-partitioned topics keyed by
ad id (``{"id": ...}``); the processor reads both, merged by record timestamp per partition. Each
side waits in a window store for its partner, and both buffers stay bounded by the join's
retention however long the streams run; records with a null key or a null value are skipped.
Joined pairs go to ``ad-clicks-joined``. Run it like ``examples/tally.py``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from statesnap import JoinWindows, Processor

proc = Processor(
    "ad-joins",
    inputs=["ad-impressions", "ad-clicks"],
    bootstrap_servers=os.environ.get("STATESNAP_BOOTSTRAP_SERVERS", "localhost:9092"),
    checkpoints=os.environ.get("STATESNAP_CHECKPOINTS", "/tmp/statesnap-examples"),
    key_serde="string",
    value_serde="json",
)


def pair(click: dict[str, Any], impression: dict[str, Any]) -> dict[str, Any]:
    return {"impression": impression["id"], "click": click["id"]}


# A click at t joins the impressions in [t - 10 min, t]; they may arrive up to a minute late.
proc.join(
    "clicks-with-impressions",
    left="ad-clicks",
    right="ad-impressions",
    window=JoinWindows.of(0, grace="1m").before("10m"),
    how="inner",
    joiner=pair,
    to="ad-clicks-joined",
)


if __name__ == "__main__":
    proc.run(follow="--once" not in sys.argv)
