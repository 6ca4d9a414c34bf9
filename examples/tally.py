"""The running tally: each account's balance from a stream of payments, emitted on every change.

Run it: ``python examples/tally.py`` (or ``statesnap run examples.tally:proc``); ``--once`` restores,
catches up, checkpoints and exits. Kafka and the checkpoint store come from the environment.
"""

from __future__ import annotations

import os
import sys

from statesnap import Processor, ProcessorContext, Record

proc = Processor(
    "tally",
    inputs=["payments"],
    bootstrap_servers=os.environ.get("STATESNAP_BOOTSTRAP_SERVERS", "localhost:9092"),
    checkpoints=os.environ.get("STATESNAP_CHECKPOINTS", "/tmp/statesnap-examples"),
    stores=["balances"],
    key_serde="string",
    value_serde="json",
)


@proc.handler
def on_payment(record: Record, ctx: ProcessorContext) -> None:
    balances = ctx.stores["balances"]
    balances[record.key] = balances.get(record.key, 0) + record.value["amount"]
    ctx.emit("balances-out", record.key, balances[record.key])


if __name__ == "__main__":
    proc.run(follow="--once" not in sys.argv)
