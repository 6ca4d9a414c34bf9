"""The operations validator: is this operation allowed on this account now?

Valid operations go to ``operations-valid``, the others to ``operations-rejected`` with the reason;
each account's state (open or closed, balance) lives in the ``accounts`` store. Run it like
``examples/tally.py``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from statesnap import Processor, ProcessorContext, Record

proc = Processor(
    "validator",
    inputs=["operations"],
    bootstrap_servers=os.environ.get("STATESNAP_BOOTSTRAP_SERVERS", "localhost:9092"),
    checkpoints=os.environ.get("STATESNAP_CHECKPOINTS", "/tmp/statesnap-examples"),
    stores=["accounts"],
    key_serde="string",
    value_serde="json",
)


def rejection(account: dict[str, Any] | None, op: dict[str, Any]) -> str | None:
    """Why *op* is not allowed on *account* now, or None."""
    kind = op.get("op")
    if kind == "open":
        return "already open" if account is not None and account["open"] else None
    if account is None or not account["open"]:
        return "account not open"
    if kind == "withdraw" and op["amount"] > account["balance"]:
        return "insufficient funds"
    if kind == "close" and account["balance"] != 0:
        return "balance not zero"
    return None if kind in ("deposit", "withdraw", "close") else f"unknown operation {kind!r}"


def applied(account: dict[str, Any] | None, op: dict[str, Any]) -> dict[str, Any]:
    if op["op"] == "open":
        return {"open": True, "balance": 0}
    assert account is not None
    sign = {"deposit": 1, "withdraw": -1}.get(op["op"], 0)
    return {"open": op["op"] != "close", "balance": account["balance"] + sign * op.get("amount", 0)}


@proc.handler
def validate(record: Record, ctx: ProcessorContext) -> None:
    accounts = ctx.stores["accounts"]
    account = accounts.get(record.key)
    reason = rejection(account, record.value)
    if reason is None:
        accounts[record.key] = applied(account, record.value)
        ctx.emit("operations-valid", record.key, record.value)
    else:
        ctx.emit("operations-rejected", record.key, {**record.value, "reason": reason})


if __name__ == "__main__":
    proc.run(follow="--once" not in sys.argv)
