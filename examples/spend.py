"""A per-key aggregate bootstrapped on Spark, resumed in Python: each customer's total spend.

Fold years of purchases on a cluster (one Spark task per partition, in parallel), then let a
service resume from that checkpoint in seconds::

    statesnap run spend:proc --engine spark      # from examples/: the history, on Spark
    python examples/spend.py                     # the service: restores, then keeps up

(or ``bootstrap_processor(spark, proc)`` from ``statesnap.spark`` in a PySpark job).
"""

from __future__ import annotations

import os
import sys

from statesnap import Processor

proc = Processor(
    "spend",
    inputs=["purchases"],
    bootstrap_servers=os.environ.get("STATESNAP_BOOTSTRAP_SERVERS", "localhost:9092"),
    checkpoints=os.environ.get("STATESNAP_CHECKPOINTS", "/tmp/statesnap-examples"),
    key_serde="string",
    value_serde="json",
)
proc.sum("spent", "amount")

if __name__ == "__main__":
    proc.run(follow="--once" not in sys.argv)
