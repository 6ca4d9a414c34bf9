"""A follower's status in the Prometheus text exposition format (version 0.0.4).

Written by hand: a dozen gauges do not justify a dependency on ``prometheus_client``.
"""

from __future__ import annotations

from collections.abc import Iterable

from statesnap.follower import FollowerStatus

#: The media type Prometheus scrapers expect for the text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}"


def _number(x: float) -> str:
    return repr(float(x)) if isinstance(x, float) else str(x)


def render_metrics(status: FollowerStatus) -> str:
    """Gauges describing one follower; every sample carries ``table`` and ``topic`` labels.

    ``statesnap_follower_checkpoint_generation`` is 0 when the replica booted by full replay
    (generations start at 1); age gauges are absent until a record has been applied.
    """
    base = (("table", status.table), ("topic", status.topic))
    lines: list[str] = []

    def gauge(
        name: str, help_text: str, samples: Iterable[tuple[tuple[tuple[str, str], ...], float]]
    ) -> None:
        rows = list(samples)
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f"{name}{_labels(base + extra)} {_number(value)}" for extra, value in rows)

    gauge(
        "statesnap_follower_up",
        "1 when the replica is restored and tailing (ready).",
        [((), int(status.ready))],
    )
    gauge(
        "statesnap_follower_caught_up",
        "1 when every partition is at end-of-partition.",
        [((), int(status.caught_up))],
    )
    gauge("statesnap_follower_keys", "Keys held by the replica.", [((), status.keys)])
    gauge(
        "statesnap_follower_offset",
        "Next offset to consume per partition (every record below it is applied).",
        [((("partition", str(p)),), off) for p, off in sorted(status.offsets.items())],
    )
    gauge(
        "statesnap_follower_lag_records",
        "Records behind per partition (0 at end-of-partition, else an estimate from the high watermark).",
        [((("partition", str(p)),), n) for p, n in sorted(status.lag.items())],
    )
    if status.restore_seconds is not None:
        gauge(
            "statesnap_follower_restore_seconds",
            "Seconds the boot took (checkpoint load plus tail replay).",
            [((), status.restore_seconds)],
        )
    gauge(
        "statesnap_follower_checkpoint_generation",
        "Checkpoint generation the replica booted from (0: full replay).",
        [((), status.checkpoint_generation or 0)],
    )
    gauge(
        "statesnap_follower_replayed_records",
        "Changelog records replayed during the boot.",
        [((), status.replayed_records)],
    )
    if status.last_update_age is not None:
        gauge(
            "statesnap_follower_last_update_age_seconds",
            "Seconds since the replica last applied a changelog record.",
            [((), status.last_update_age)],
        )
    if status.newest_record_age is not None:
        gauge(
            "statesnap_follower_newest_record_age_seconds",
            "Seconds since the timestamp of the newest record applied.",
            [((), status.newest_record_age)],
        )
    return "\n".join(lines) + "\n"
