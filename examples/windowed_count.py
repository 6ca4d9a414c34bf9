"""A windowed count with retention: page views per page per minute, by event time.

Late views (their minute closed more than 10 s ago in stream time) are dropped; a minute's count
leaves the store, and the next checkpoint, 10 minutes after the minute began. Run it like
``examples/tally.py``.
"""

from __future__ import annotations

import os
import sys

from statesnap import Processor, Windows

proc = Processor(
    "page-views",
    inputs=["views"],
    bootstrap_servers=os.environ.get("STATESNAP_BOOTSTRAP_SERVERS", "localhost:9092"),
    checkpoints=os.environ.get("STATESNAP_CHECKPOINTS", "/tmp/statesnap-examples"),
    key_serde="string",
    value_serde="json",
)
proc.count("views-per-minute", window=Windows.tumbling("1m", grace="10s", retention="10m"))

if __name__ == "__main__":
    proc.run(follow="--once" not in sys.argv)
