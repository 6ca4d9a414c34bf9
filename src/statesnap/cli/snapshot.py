"""``statesnap snapshot …``: consistent snapshots of a table across all its tasks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import (
    engine_option,
    json_option,
    pairs_to_dict,
    snapshot_cluster_options,
    snapshot_store_args,
    storage_options,
)
from statesnap.cli.output import Output

if TYPE_CHECKING:  # imported where a command runs: the snapshot package loads pyarrow and Kafka's client
    from statesnap.processor.diff import SnapshotDiff
    from statesnap.snapshot.api import SnapshotApi
    from statesnap.snapshot.model import Snapshot

__all__ = [
    "clone",
    "common",
    "create",
    "current",
    "delete",
    "diff",
    "list_cmd",
    "pin",
    "show",
    "snapshot",
    "unpin",
]


@docs_page("how-to/snapshots.md")
@click.group()
def snapshot() -> None:
    """Create, list, show, pin and delete consistent snapshots of a table.

    \b
    A snapshot is one generation in which every task owning partitions of the table (every
    `materialize --instance I --instances N` process) wrote its checkpoint after a commit. It
    is COMPLETED when all partitions reported, FAILED when a task failed or it timed out.
    Restore one with `statesnap dump ... --generation GEN` or Table(generation=GEN).
    """


def common(f: Any) -> Any:
    f = json_option(f)
    f = storage_options(f)
    f = snapshot_cluster_options(f)
    f = click.option(
        "--table", required=True, envvar="STATESNAP_TABLE", help="Table name. [env: STATESNAP_TABLE]"
    )(f)
    return click.argument("url", envvar="STATESNAP_CHECKPOINTS")(f)


def _api(url: str, table: str, storage_pairs: tuple[str, ...]) -> SnapshotApi:
    from statesnap.snapshot.api import SnapshotApi

    where = snapshot_store_args()
    options: dict[str, Any] = pairs_to_dict(storage_pairs, "--storage-option")
    api = SnapshotApi.open(
        url, table, snapshot_store=where["snapshot_store"], kafka=where["kafka"], **options
    )
    click.get_current_context().call_on_close(api.close)
    return api


def _line(s: Snapshot) -> str:
    flags = " pinned" if s.pinned else ""
    label = f" [{s.label}]" if s.label else ""
    tasks = ",".join(sorted(s.tasks)) or "-"
    extra = f"  {s.error}" if s.error else ""
    return (
        f"gen {s.generation:>6}  {s.state.value:<9} {s.created_at.isoformat()}  tasks={tasks}"
        f"{label}{flags}{extra}"
    )


def _print(s: Snapshot, as_json: bool) -> None:
    from statesnap.snapshot.api import snapshot_json

    Output(as_json).show(snapshot_json(s), _lines(s))


def _lines(s: Snapshot) -> Iterator[str]:
    from statesnap.snapshot.model import SnapshotState

    yield _line(s)
    if s.state is SnapshotState.CREATED and s.missing_partitions:
        yield f"  waiting for partitions {s.missing_partitions}"


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.option("--wait", is_flag=True, help="Wait until the snapshot completes, fails or --timeout passes.")
@click.option("--timeout", default="60s", show_default=True, help="Deadline for every task to report.")
@click.option("--label", default=None, help="A free-form label stored with the snapshot.")
@click.option("--pin", is_flag=True, help="Keep it through retention GC until unpinned.")
@click.option("--expires-in", default=None, help="Keep it through GC at least this long (e.g. 7d).")
def create(
    url: str,
    table: str,
    storage_pairs: tuple[str, ...],
    as_json: bool,
    wait: bool,
    timeout: str,
    label: str | None,
    pin: bool,
    expires_in: str | None,
) -> None:
    """Start a snapshot (or return the one in progress); with --wait, print it once finished.

    Exits 1 if --wait ends with the snapshot FAILED or still incomplete.
    """
    from statesnap.snapshot.model import SnapshotState

    api = _api(url, table, storage_pairs)
    snap = api.create(label=label, pin=pin, timeout=timeout, expires_in=expires_in)
    if wait:
        snap = api.wait(snap.generation, timeout)
    _print(snap, as_json)
    if wait and snap.state is not SnapshotState.COMPLETED:
        raise SystemExit(1)


@docs_page("how-to/snapshots.md")
@snapshot.command("list")
@common
def list_cmd(url: str, table: str, storage_pairs: tuple[str, ...], as_json: bool) -> None:
    """List snapshots, newest first."""
    from statesnap.snapshot.api import snapshot_json

    snaps = _api(url, table, storage_pairs).list()
    Output(as_json).show([snapshot_json(s) for s in snaps], (_line(s) for s in snaps))


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.argument("generation", type=int)
def show(url: str, table: str, storage_pairs: tuple[str, ...], as_json: bool, generation: int) -> None:
    """Show one snapshot with every task's offsets."""
    from statesnap.snapshot.api import snapshot_json

    s = _api(url, table, storage_pairs).get(generation)
    Output(as_json).show(snapshot_json(s), _task_lines(s))


def _task_lines(s: Snapshot) -> Iterator[str]:
    yield _line(s)
    for task in sorted(s.tasks.values(), key=lambda t: t.task_id):
        offsets = ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(task.offsets.items()))
        yield f"  task {task.task_id}: {offsets}"


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
def current(url: str, table: str, storage_pairs: tuple[str, ...], as_json: bool) -> None:
    """Show the current (newest) snapshot."""
    _print(_api(url, table, storage_pairs).current(), as_json)


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.argument("generation", type=int)
def delete(url: str, table: str, storage_pairs: tuple[str, ...], as_json: bool, generation: int) -> None:
    """Delete a snapshot (its files are removed by the next GC)."""
    _api(url, table, storage_pairs).delete(generation)
    Output(as_json).show({"deleted": generation}, f"deleted snapshot {generation}")


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.argument("generation", type=int)
def pin(url: str, table: str, storage_pairs: tuple[str, ...], as_json: bool, generation: int) -> None:
    """Pin a snapshot: retention GC keeps it."""
    _print(_api(url, table, storage_pairs).pin(generation), as_json)


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.argument("generation", type=int)
def unpin(url: str, table: str, storage_pairs: tuple[str, ...], as_json: bool, generation: int) -> None:
    """Unpin a snapshot: retention GC may delete it again."""
    _print(_api(url, table, storage_pairs).unpin(generation), as_json)


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.argument("old", type=int)
@click.argument("new", type=int)
@engine_option(
    "spark: run the join on Spark (for tables larger than memory).",
    choices=("python", "spark"),
    default="python",
)
@click.option(
    "--store",
    "store_name",
    default=None,
    metavar="STORE",
    help="Of a processor, diff only this store (default: every store, each counted on its own).",
)
def diff(
    url: str,
    table: str,
    storage_pairs: tuple[str, ...],
    as_json: bool,
    old: int,
    new: int,
    engine: str,
    store_name: str | None,
) -> None:
    """Keys added, removed and changed between snapshots OLD and NEW.

    Of a processor, per store (its own bookkeeping never counted): a key is a store's key in one
    partition (a window store's with its window start), examples shown as STORE:KEY.
    """
    from statesnap.processor.diff import diff_snapshots

    api = _api(url, table, storage_pairs)
    for generation in (old, new):
        api.get(generation)  # SnapshotNotFoundError naming it, on both engines, before any work
    if engine == "spark":
        from statesnap.cli.spark_engine import diff_on_spark

        options = pairs_to_dict(storage_pairs, "--storage-option")
        result = diff_on_spark(api, old, new, options, store=store_name)
    else:
        result = diff_snapshots(api.repo, old, new, store=store_name)
    Output(as_json).show(result.to_json(), _diff_lines(f"{old} → {new}", result))


def _diff_lines(head: str, result: SnapshotDiff) -> Iterator[str]:
    yield (
        f"{head}: +{result.added} added, -{result.removed} removed, ~{result.changed} changed, "
        f"{result.unchanged} unchanged ({result.old} → {result.new} keys)"
    )
    for name, store in sorted(result.stores.items()):
        yield from _diff_lines(f"  store {name}", store)


@docs_page("how-to/snapshots.md")
@snapshot.command()
@common
@click.argument("generation", type=int)
@click.option("--to-table", required=True, help="The new table's name (must not exist yet).")
@click.option(
    "--to",
    "to_url",
    default=None,
    help="Checkpoint store of the clone (default: the same as the source's), e.g. s3://bucket/prefix.",
)
@click.option(
    "--to-storage-option",
    "to_storage_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Blob-store option for --to (default: the --storage-option values); repeatable.",
)
@click.option("--pin", is_flag=True, help="Pin the clone (kept through GC until unpinned); default: not.")
@click.option("--label", default=None, help="The clone's snapshot label (default: 'clone of TABLE@GEN').")
def clone(
    url: str,
    table: str,
    storage_pairs: tuple[str, ...],
    as_json: bool,
    generation: int,
    to_table: str,
    to_url: str | None,
    to_storage_pairs: tuple[str, ...],
    pin: bool,
    label: str | None,
) -> None:
    """Copy snapshot GENERATION into a new table TO_TABLE (blue/green: start the new version of
    an application with the new name while the old one keeps running).

    \b
    Files are copied server-side on S3 and hard-linked (or copied) on a filesystem; the clone has
    its own descriptor, manifest and COMPLETED snapshot record (same generation number), and GC
    of either table never deletes the other's files. Refused: an existing target, a missing
    generation, a FAILED or unfinished one.
    """
    from statesnap.snapshot.clone import clone_generation

    where = snapshot_store_args()
    options = pairs_to_dict(storage_pairs, "--storage-option")
    to_options = pairs_to_dict(to_storage_pairs, "--to-storage-option") if to_storage_pairs else None
    result = clone_generation(
        url,
        table,
        generation,
        to_table,
        to=to_url,
        storage_options=options,
        to_storage_options=to_options,
        snapshot_store=where["snapshot_store"],
        kafka=where["kafka"],
        pin=pin,
        label=label,
    )
    Output(as_json).result(result)
