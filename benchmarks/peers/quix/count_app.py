"""The Quix Streams side of ``benchmarks/processors.py``: a count per message key, run in its own venv.

It imports only Quix Streams (never statesnap): ``benchmarks/processors.py`` runs it with the
interpreter of ``~/.cache/statesnap/peers/quix-venv`` so Quix's pins never touch ours.

    python count_app.py --mode process --bootstrap HOST:PORT --topic T --group G --state-dir D \
        --expect N --result out.json [--windowed] [--consumer-config '{"k": "v"}']

``--mode process`` consumes from the earliest offset; ``--mode recover`` is the same app started
again (the driver deleted its state dir first): Quix restores the store from its changelog topic
before it resumes the input at the committed offsets. Either way the app stops itself after it has
processed ``--expect`` input records (``on_message_processed``), so "complete" is exact: the last
expected input record went through the handler. While the changelog is being read Quix pauses
the input partitions, so the first input record processed marks the end of recovery.

The result (a JSON object) goes to ``--result``: seconds from ``Application()`` to the first and the
last record processed, the changelog topic names, and in recover mode the last count of every key
the tail touched (the driver checks them against its own recount).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from quixstreams import Application, State


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["process", "recover"], required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--expect", type=int, required=True, help="input records to process, then stop")
    ap.add_argument("--result", required=True)
    ap.add_argument("--windowed", action="store_true", help="tumbling 1-minute window count")
    ap.add_argument("--consumer-config", default="{}")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()

    seen = {"n": 0, "first": 0.0, "last": 0.0}

    def on_processed(_topic: str, _partition: int, _offset: int) -> None:
        now = time.monotonic()
        seen["n"] += 1
        if seen["n"] == 1:
            seen["first"] = now
        if seen["n"] == args.expect:
            seen["last"] = now
            app.stop()

    t0 = time.monotonic()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        consumer_extra_config=json.loads(args.consumer_config),
        loglevel="INFO",
        on_message_processed=on_processed,
    )
    topic = app.topic(args.topic, key_deserializer="str", value_deserializer="json")
    sdf = app.dataframe(topic)
    last: dict[str, int] = {}
    recover = args.mode == "recover"

    if args.windowed:
        sdf = sdf.tumbling_window(duration_ms=timedelta(minutes=1), grace_ms=0).count().final()
    else:

        def count(_value: Any, key: str, _ts: int, _headers: Any, state: State) -> int:
            c: int = state.get("count", 0) + 1
            state.set("count", c)
            if recover:
                last[key] = c
            return c

        sdf = sdf.apply(count, stateful=True, metadata=True)

    # The deadline: a run that never gets its records (a stuck join, a broken recovery) stops itself.
    watchdog = threading.Timer(args.timeout, app.stop)
    watchdog.daemon = True
    watchdog.start()
    app.run()
    watchdog.cancel()
    done = time.monotonic()
    out = {
        "mode": args.mode,
        "records": seen["n"],
        "seconds_to_first": round(seen["first"] - t0, 3) if seen["n"] else None,
        "seconds_to_last": round(seen["last"] - t0, 3) if seen["last"] else None,
        "seconds_to_stopped": round(done - t0, 3),
        "changelog_topics": [t.name for t in app._topic_manager.changelog_topics_list],
        "counts": last,
    }
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(out, f)
    if seen["n"] < args.expect:
        sys.exit(f"quix {args.mode}: processed {seen['n']} of {args.expect} records in {args.timeout:.0f}s")


if __name__ == "__main__":
    main()
