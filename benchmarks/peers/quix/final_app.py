"""The Quix Streams side of ``benchmarks/final_results.py``: a tumbling-window count per key whose
final result per window goes to an output topic once the window closes, run in its own venv.

It imports only Quix Streams (never statesnap): the driver runs it with the interpreter of
``~/.cache/statesnap/peers/quix-venv`` (made by ``benchmarks/processors.py``'s ``quix_python``) so
Quix's pins never touch ours.

    python final_app.py --bootstrap HOST:PORT --input T --output O --group G --state-dir D \
        --size-ms 60000 --grace-ms 10000 [--consumer-config '{"k": "v"}'] [--exactly-once]

``sdf.tumbling_window(size, grace_ms=grace).count().final(closing_strategy="partition")``: a window
closes when the partition's stream time passes its end plus grace, the rule Kafka Streams'
``suppress(untilWindowCloses)`` and statesnap's ``emit="final"`` follow. Quix's default
("key") would close a key's windows only when that key's next record arrives, so a quiet key's
final result would wait for it: not the same results at the same moments. Quix writes
``{"start": S, "end": E, "value": N}`` with the input key, the layout the others write.

It runs until the driver stops it (SIGTERM: Quix closes cleanly) or ``--timeout`` passes; the
driver times it by what reaches the output topic, so it prints nothing the driver reads.
"""

from __future__ import annotations

import argparse
import json
import threading

from quixstreams import Application


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--size-ms", type=int, required=True)
    ap.add_argument("--grace-ms", type=int, required=True)
    ap.add_argument("--consumer-config", default="{}")
    ap.add_argument("--exactly-once", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args()

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=args.state_dir,
        consumer_extra_config=json.loads(args.consumer_config),
        processing_guarantee="exactly-once" if args.exactly_once else "at-least-once",
        loglevel="WARNING",
    )
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer="json")
    sink = app.topic(args.output, key_serializer="bytes", value_serializer="json")
    sdf = app.dataframe(source)
    sdf = (
        sdf.tumbling_window(duration_ms=args.size_ms, grace_ms=args.grace_ms)
        .count()
        .final(closing_strategy="partition")
    )
    sdf.to_topic(sink)

    # The deadline: a run the driver never stops (a stuck driver) stops itself.
    watchdog = threading.Timer(args.timeout, app.stop)
    watchdog.daemon = True
    watchdog.start()
    app.run()
    watchdog.cancel()


if __name__ == "__main__":
    main()
