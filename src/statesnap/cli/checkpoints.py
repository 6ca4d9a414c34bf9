"""``statesnap checkpoints list|show|verify|gc``: inspect and maintain a checkpoint store."""

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
from statesnap.durations import parse_duration
from statesnap.errors import CheckpointError, CorruptCheckpointError, TableNotFoundError

if TYPE_CHECKING:  # the checkpoint package loads pyarrow: imported where a command runs
    from statesnap.checkpoint import CheckpointManifest, CheckpointRepository
    from statesnap.checkpoint.discovery import TableLocation

__all__ = ["checkpoints", "common", "gc", "list_cmd", "migrate", "show", "verify"]


@docs_page("how-to/checkpoints.md")
@click.group()
def checkpoints() -> None:
    """Inspect and maintain checkpoints in a store (URL: path, file:///path or s3://bucket/prefix)."""


def _tables(url: str, table: str | None, storage_pairs: tuple[str, ...]) -> list[TableLocation]:
    from statesnap.blob import open_blob_store
    from statesnap.checkpoint.discovery import discover_tables

    store = open_blob_store(url, **pairs_to_dict(storage_pairs, "--storage-option"))
    store.check(writable=False)
    found: list[TableLocation] = discover_tables(store, table)
    if not found:
        raise TableNotFoundError(
            f"no checkpoints{f' of table {table!r}' if table else ''} under {store.shown}"
        )
    click.get_current_context().meta["statesnap.store"] = store
    return found


def _locations(url: str, table: str | None, storage_pairs: tuple[str, ...]) -> list[CheckpointRepository]:
    from statesnap.checkpoint import CheckpointRepository

    found = _tables(url, table, storage_pairs)
    store = click.get_current_context().meta["statesnap.store"]
    return [CheckpointRepository(store, loc.directory) for loc in found]


def _summary(gen: int, item: CheckpointManifest | CorruptCheckpointError) -> dict[str, Any]:
    if isinstance(item, CorruptCheckpointError):
        return {"generation": gen, "state": "CORRUPT", "error": str(item)}
    return {
        "generation": gen,
        "state": item.state.value,
        "created_at": item.created_at.isoformat(),
        "table": item.table,
        "topic": item.topic,
        "cluster_id": item.cluster_id,
        "partitions": len(item.partitions),
        "keys": item.keys,
        "rows": item.total_rows,
        "bytes": item.total_bytes,
        "offsets": item.offsets,
        "engine": item.writer.get("engine"),
    }


def common(f: Any) -> Any:
    f = click.option(
        "--table", envvar="STATESNAP_TABLE", help="Table name; omit to act on every table under URL."
    )(f)
    f = storage_options(f)
    f = json_option(f)
    return click.argument("url", envvar="STATESNAP_CHECKPOINTS")(f)


@docs_page("how-to/checkpoints.md")
@checkpoints.command("list")
@common
def list_cmd(url: str, table: str | None, storage_pairs: tuple[str, ...], as_json: bool) -> None:
    """List checkpoints, newest first."""
    rows = []
    for repo in _locations(url, table, storage_pairs):
        for gen, item in repo.manifests():
            rows.append({"location": repo.shown, **_summary(gen, item)})
    Output(as_json).show(rows, (_list_line(r) for r in rows))


def _list_line(r: dict[str, Any]) -> str:
    if r["state"] == "CORRUPT":
        return f"{r['location']}  gen {r['generation']:>6}  CORRUPT  {r['error']}"
    # ``keys`` is the table's key count; where a writer did not record it (Spark streaming
    # deltas) the files' rows, which count superseded values and tombstones, are no stand-in.
    size = f"{r['keys']:>10,} keys" if r["keys"] is not None else f"keys unknown ({r['rows']:,} rows)"
    return (
        f"{r['location']}  gen {r['generation']:>6}  {r['state']:<9} {r['created_at']}  "
        f"{size}  {r['bytes']:>12,} B  engine={r['engine']}"
    )


@docs_page("how-to/checkpoints.md")
@checkpoints.command()
@common
@click.argument("generation", type=int, required=False)
def show(
    url: str, table: str | None, storage_pairs: tuple[str, ...], as_json: bool, generation: int | None
) -> None:
    """Show one checkpoint's manifest (default: the newest that verifies, files present with
    their sizes), including how it was written. --json adds the table's ``location`` and each
    file's ``url``: the file list any engine reads the checkpoint from."""
    repos = _locations(url, table, storage_pairs)
    if len(repos) > 1:
        raise click.UsageError("several tables under URL; pick one with --table")
    repo = repos[0]
    if generation is None:
        generation = next((g for g in repo.generations() if repo.verify(g, deep=False).restorable), None)
    gen = generation
    if gen is None:
        raise CheckpointError(f"no usable checkpoint in {repo.shown}")
    manifest = repo.read_manifest(gen)
    obj = manifest.to_json()
    for part in obj["partitions"].values():
        for f in part["files"]:
            f["url"] = f"{repo.url}/{f['path']}"
    Output(as_json).show({"location": repo.shown, **obj}, _show_lines(repo.shown, manifest))


def _show_lines(url: str, manifest: CheckpointManifest) -> Iterator[str]:
    yield (
        f"{url} generation {manifest.generation}: {manifest.state.value}, "
        f"created {manifest.created_at.isoformat()}"
    )
    yield f"  table {manifest.table} over topic {manifest.topic} on cluster {manifest.cluster_id}"
    writer = ", ".join(f"{k}={v}" for k, v in manifest.writer.items())
    yield f"  written by: {writer}"
    if manifest.state_versions:
        versions = ", ".join(f"{store}={v}" for store, v in sorted(manifest.state_versions.items()))
        yield f"  state versions: {versions}"
    for p, pc in sorted(manifest.partitions.items()):
        files = ", ".join(f"{f.kind}:{f.rows} rows/{f.bytes} B" for f in pc.files) or "empty"
        yield f"  partition {p:>4}: next offset {pc.next_offset:>12}  {files}"


@docs_page("how-to/checkpoints.md")
@checkpoints.command()
@common
@snapshot_cluster_options
@click.option("--shallow", is_flag=True, help="Only check files exist with the right size (no checksums).")
def verify(url: str, table: str | None, storage_pairs: tuple[str, ...], as_json: bool, shallow: bool) -> None:
    """Verify everything a restore reads: every checkpoint (the manifest readable, matching its own
    checksum and of this table, COMPLETED, files present with their sizes and checksums, and holding
    the rows, offsets and keys the manifest claims), the table descriptor, the generation high-water
    mark, the snapshot records (agreeing with the manifests) and the Spark journal.

    A table whose snapshot records live in a Kafka topic needs -b to have them read; without it they
    are reported as not checked. Exits 1 if anything is corrupt or unchecked (restores would skip a
    corrupt checkpoint; one whose only damage is a base's key index still restores, rebuilding the
    index, and says so). A generation GC deletes while it is checked is reported as gone, not corrupt.
    """
    from statesnap.checkpoint import CheckpointRepository
    from statesnap.snapshot.audit import verify_table_metadata

    results: list[dict[str, Any]] = []
    shown: list[str] = []  # each result's location as the user gave it, for the lines a person reads
    kafka = snapshot_store_args()["kafka"]
    for loc in _tables(url, table, storage_pairs):
        repo = CheckpointRepository(click.get_current_context().meta["statesnap.store"], loc.directory)
        for gen in repo.generations():
            verdict = repo.verify(gen, deep=not shallow)
            if verdict.vanished:
                continue
            results.append(
                {
                    "location": repo.url,
                    "generation": gen,
                    "ok": verdict.ok,
                    "restorable": verdict.restorable,
                    "problems": list(verdict.problems),
                }
            )
            shown.append(repo.shown)
        metadata = verify_table_metadata(repo, loc.table, kafka=kafka)
        results.append({"location": repo.url, "generation": None, "ok": not metadata, "problems": metadata})
        shown.append(repo.shown)
    Output(as_json).show(results, (_verify_line(s, r) for s, r in zip(shown, results, strict=True)))
    if not all(r["ok"] for r in results):
        raise SystemExit(1)


def _verify_line(location: str, r: dict[str, Any]) -> str:
    if r["ok"]:
        status = "ok"
    elif r.get("restorable"):  # only a key index is damaged: derived data, rebuilt on restore
        status = "KEY INDEX DAMAGED (restores rebuild it): " + "; ".join(r["problems"])
    else:
        status = "CORRUPT: " + "; ".join(r["problems"])
    what = (
        f"gen {r['generation']:>6}"
        if r["generation"] is not None
        else "descriptor, high-water mark, snapshot records, journal"
    )
    return f"{location}  {what}  {status}"


@docs_page("how-to/checkpoints.md")
@checkpoints.command()
@common
@snapshot_cluster_options
@click.option("--min-count", default=10, show_default=True, help="Keep at least this many checkpoints.")
@click.option("--min-age", default="12h", show_default=True, help="Keep every checkpoint younger than this.")
@click.option(
    "--orphan-grace",
    default="1h",
    show_default=True,
    help="Keep unreferenced files younger than this (writers in flight).",
)
@click.option("--dry-run", is_flag=True, help="Report what would be deleted, delete nothing.")
def gc(
    url: str,
    table: str | None,
    storage_pairs: tuple[str, ...],
    as_json: bool,
    min_count: int,
    min_age: str,
    orphan_grace: str,
    dry_run: bool,
) -> None:
    """Delete checkpoints that are neither among the newest --min-count nor younger than --min-age,
    then data files no retained checkpoint references, orphans and stale uploads.

    Pinned and unexpired snapshots, the newest usable checkpoint, snapshots in progress and files the
    Spark journal still needs are always kept, whichever engine wrote them; --dry-run lists exactly
    what a real run would delete.
    """
    from statesnap.checkpoint import CheckpointRepository, RetentionPolicy
    from statesnap.snapshot.api import SnapshotApi

    policy = RetentionPolicy(min_count, parse_duration(min_age), parse_duration(orphan_grace))
    reports, shown = [], []
    for loc in _tables(url, table, storage_pairs):
        store = click.get_current_context().meta["statesnap.store"]
        repo = CheckpointRepository(store, loc.directory)
        shown.append(repo.shown)  # a person's lines name the location as given; --json the URL
        api = SnapshotApi.for_repo(repo, loc.table, **snapshot_store_args())
        try:
            reports.append(api.gc(policy, dry_run=dry_run))
        finally:
            api.close()
    verb = "would delete" if dry_run else "deleted"
    Output(as_json).show(
        [r.to_json() for r in reports],
        (
            f"{where}: kept {r.retained} (pinned {r.pinned}), {verb} generations "
            f"{r.deleted_generations}, {len(r.deleted_files)} files, {len(r.orphans)} orphans, "
            f"{len(r.deleted_records)} snapshot records, {r.aborted_uploads} stale uploads"
            for where, r in zip(shown, reports, strict=True)
        ),
    )


@docs_page("how-to/checkpoints.md")
@checkpoints.command()
@click.argument("url", envvar="STATESNAP_CHECKPOINTS")
@click.option("--table", required=True, envvar="STATESNAP_TABLE", help="The table to migrate.")
@click.option(
    "--function",
    "function",
    required=True,
    metavar="MODULE:FN",
    help="fn(key, value) -> (key, value) | (key, value, partition) | None on stored bytes (None drops the "
    "row), or a {version: fn} dict chained up to --to-version; MODULE is imported from the current "
    "directory or PYTHONPATH.",
)
@click.option(
    "--from-version",
    type=int,
    default=None,
    help="The state version the source must hold [default: 1 for a function, as recorded for a dict].",
)
@click.option(
    "--to-version",
    type=int,
    default=None,
    help="The state version written [default: the next for a function, past the last step for a dict].",
)
@click.option("--generation", type=int, default=None, help="The generation to migrate [default: the newest].")
@click.option(
    "--partitioner",
    type=click.Choice(["murmur2_random", "consistent_random"]),
    default="murmur2_random",
    show_default=True,
    help="The producers' partitioner: a changed key must stay in its partition.",
)
@engine_option(
    "python holds the migrated table in memory until it is written; spark migrates and writes "
    "each partition in a task of its own (STATESNAP_SPARK_MASTER, default local[*]), for tables "
    "larger than memory.",
    choices=("python", "spark"),
    default="python",
)
@click.option(
    "--dry-run", is_flag=True, help="Print counts (kept, changed, dropped) and a sample; write nothing."
)
@snapshot_cluster_options
@storage_options
@json_option
def migrate(
    url: str,
    table: str,
    function: str,
    from_version: int | None,
    to_version: int | None,
    generation: int | None,
    partitioner: str,
    engine: str,
    dry_run: bool,
    storage_pairs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Migrate a checkpoint of --table offline into a NEW generation at a new state version.

    The source generation is pinned (a rollback point GC keeps) and left as it is; the new one is
    numbered above every other, each partition a new base file, its manifest recording the new
    state version, so code of that version restores it without migrating. A key the migration
    moves out of its partition is refused, as is a --from-version the checkpoint does not hold.
    """
    from statesnap.task.offline_migration import load_migration, migrate_checkpoint

    migration = load_migration(function)
    spark = None
    if engine == "spark":
        from statesnap.cli.spark_engine import spark_session
        from statesnap.spark.migration import ship_by_value

        spark = spark_session()
        ship_by_value(function.partition(":")[0])
    try:
        result = migrate_checkpoint(
            url,
            table,
            migration,
            from_version=from_version,
            to_version=to_version,
            generation=generation,
            dry_run=dry_run,
            storage_options=pairs_to_dict(storage_pairs, "--storage-option"),
            partitioner="consistent_random" if partitioner == "consistent_random" else "murmur2_random",
            spark=spark,
            **snapshot_store_args(),
        )
    finally:
        if spark is not None:
            spark.stop()
    if as_json or not dry_run:
        Output(as_json).result(result)
        return
    click.echo(result.summary())
    for row in result.to_json()["sample"]:
        after = "dropped" if row["new_key"] is None else f"{row['new_key']!r} = {row['new_value']!r}"
        click.echo(f"  p{row['partition']}: {row['key']!r} = {row['value']!r}  ->  {after}")
