"""statesnap's offsets rule Spark's streaming state.

Spark keeps its own record of what a streaming query processed (``<checkpointLocation>/offsets``
and ``/commits``). The materializer reads from *its* offsets (checkpoint + journal) whatever Spark
planned, so Spark being *behind* is harmless (a re-run reads nothing). Spark being *ahead* — the
checkpoint store was wiped, the topic recreated, the location reused for another cluster or table
— would make Spark plan no batch until new records arrive, and the table would stall. So before a
query starts, :func:`reconcile_query_state` compares the two; when they disagree it says so and
moves Spark's state aside (renamed, never deleted), and the query starts from statesnap's offsets.

Only local (``file://`` or plain path) locations can be inspected; others are trusted as they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MARKER", "disagreement", "reconcile_query_state", "spark_offsets"]

log = logging.getLogger(__name__)

#: Written by statesnap into the query's location: what the state belongs to.
MARKER = "statesnap-query.json"


def _local_path(location: str) -> Path | None:
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        return Path(parts.path if parts.scheme else location).expanduser()
    return None


def _batches(directory: Path) -> list[int]:
    return [int(p.name) for p in directory.glob("[0-9]*") if p.name.isdigit()]


def spark_offsets(location: Path, topic: str) -> dict[int, int] | None:
    """The end offsets Spark would resume from: those of the last batch it committed, or, before
    its first commit, of the first batch it planned (a restart re-runs that batch as planned:
    a query stopped between statesnap's checkpoint and Spark's first commit leaves exactly that).
    None when Spark has planned nothing."""
    commits = _batches(location / "commits")
    planned = _batches(location / "offsets")
    if commits:
        batch = location / "offsets" / str(max(commits))
    elif planned:
        batch = location / "offsets" / str(min(planned))
    else:
        return None
    try:
        lines = batch.read_text().splitlines()
    except OSError:
        return None
    for line in lines[2:]:  # "v1", the batch metadata, then one line per source
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and topic in obj and isinstance(obj[topic], dict):
            obj = obj[topic]
        if isinstance(obj, dict):
            try:
                return {int(p): int(o) for p, o in obj.items()}
            except (TypeError, ValueError):
                continue
    return None


def disagreement(
    spark_offsets: Mapping[int, int] | None,
    ours: Mapping[int, int],
    marker: Mapping[str, Any] | None,
    identity: Mapping[str, Any],
) -> str | None:
    """Why Spark's state cannot be trusted against statesnap's, or None if it can."""
    if marker is not None and dict(marker) != dict(identity):
        return f"it belongs to {dict(marker)}, not {dict(identity)}"
    if spark_offsets is None:
        return None
    ahead = {p: o for p, o in spark_offsets.items() if o > ours.get(p, 0)}
    if ahead:
        return (
            f"Spark committed offsets {dict(sorted(ahead.items()))} beyond statesnap's "
            f"{ {p: ours.get(p, 0) for p in sorted(ahead)} } (checkpoint store wiped, topic recreated?)"
        )
    return None


def reconcile_query_state(
    location: str, *, topic: str, offsets: Mapping[int, int], identity: Mapping[str, Any]
) -> str | None:
    """Move Spark's state at *location* aside when it disagrees with *offsets*; mark the location
    as this table's. Returns where the old state went, or None if it was kept (or absent)."""
    path = _local_path(location)
    if path is None:
        log.debug("cannot inspect Spark streaming state at %s; trusting it", location)
        return None
    marker: dict[str, Any] | None = None
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        marker = None
    moved: str | None = None
    if path.exists():
        why = disagreement(spark_offsets(path, topic), offsets, marker, identity)
        if why is not None:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            aside = path.with_name(f"{path.name}.stale-{stamp}")
            path.rename(aside)
            moved = str(aside)
            log.warning(
                "Spark streaming state in %s disagrees with statesnap's checkpoints: %s; moved it to %s "
                "and starting from statesnap's offsets",
                path,
                why,
                aside,
            )
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text(json.dumps(dict(identity)))
    return moved
