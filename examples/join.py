"""A windowed stream–stream join: each ad click joined with the impressions of the same ad in the
10 minutes before it, whichever of the two arrives first.

Impressions (``ad-impressions``) and clicks (``ad-clicks``) are two co-partitioned topics keyed by
ad id (``{"id": ...}``); the processor reads both (``record.topic`` says which), merged by record
timestamp per partition. Each side waits in a window store for its partner, and both buffers stay
bounded: a minute's bucket leaves its store at retention (12 minutes), however long the streams
run. Joined pairs go to ``ad-clicks-joined``. Run it like ``examples/tally.py``.
"""

from __future__ import annotations

import os
import sys

from statesnap import Processor, ProcessorContext, Record, StoreSpec, Windows

WITHIN_MS = 10 * 60_000
BUCKETS = Windows.tumbling("1m", grace="1m", retention="12m")

proc = Processor(
    "ad-joins",
    inputs=["ad-impressions", "ad-clicks"],
    bootstrap_servers=os.environ.get("STATESNAP_BOOTSTRAP_SERVERS", "localhost:9092"),
    checkpoints=os.environ.get("STATESNAP_CHECKPOINTS", "/tmp/statesnap-examples"),
    stores=[StoreSpec("impressions", window=BUCKETS), StoreSpec("clicks", window=BUCKETS)],
    key_serde="string",
    value_serde="json",
)


@proc.handler
def join(record: Record, ctx: ProcessorContext) -> None:
    event = record.value
    mine, theirs = (
        ("impressions", "clicks") if record.topic == "ad-impressions" else ("clicks", "impressions")
    )
    # Impressions join the clicks up to 10 minutes after them; clicks the impressions before them.
    lo, hi = (
        (record.timestamp, record.timestamp + WITHIN_MS)
        if mine == "impressions"
        else (record.timestamp - WITHIN_MS, record.timestamp)
    )
    partners = ctx.window_stores[theirs]
    for _start, events in partners.fetch(record.key, lo - BUCKETS.size_ms, hi):
        for other in events:
            if lo <= other["ts"] <= hi:
                impression, click = (event, other) if mine == "impressions" else (other, event)
                ctx.emit(
                    "ad-clicks-joined", record.key, {"impression": impression["id"], "click": click["id"]}
                )
    buffer = ctx.window_stores[mine]
    for start in buffer.windows_for(record.timestamp):
        buffer.put(record.key, start, [*buffer.get(record.key, start, []), {**event, "ts": record.timestamp}])


if __name__ == "__main__":
    proc.run(follow="--once" not in sys.argv)
