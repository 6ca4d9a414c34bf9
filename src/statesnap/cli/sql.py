"""``statesnap sql``: DuckDB SQL over any generation of a table or processor store."""

from __future__ import annotations

import click

from statesnap.cli.docs import docs_page
from statesnap.cli.options import json_option, pairs_to_dict, storage_options
from statesnap.cli.output import Output

__all__ = ["sql"]


@docs_page("how-to/incident-sql.md")
@click.command()
@click.argument("url", envvar="STATESNAP_CHECKPOINTS")
@click.argument("query")
@click.option("--table", required=True, envvar="STATESNAP_TABLE", help="Table (or processor) name.")
@click.option(
    "--generation", type=int, default=None, help="The generation to read (default: the newest usable)."
)
@click.option("--store", default=None, help="A processor's store: the view is named after it.")
@click.option(
    "--key-serde",
    type=click.Choice(["bytes", "string", "json"]),
    default=None,
    help="Add key_string / key_json, the key decoded.",
)
@click.option(
    "--value-serde",
    type=click.Choice(["bytes", "string", "json"]),
    default=None,
    help="Add value_string / value_json, the value decoded (value_json->>'field').",
)
@click.option("--cluster-id", default=None, help="Pick the cluster when several share the table name.")
@storage_options
@json_option
def sql(
    url: str,
    query: str,
    table: str,
    generation: int | None,
    store: str | None,
    key_serde: str | None,
    value_serde: str | None,
    cluster_id: str | None,
    storage_pairs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run QUERY against the table at a checkpoint, the view named after it (quote names with - or
    .: SELECT count(*) FROM "orders-v2").

    \b
    Columns: key, value (BLOB; a deleted key is not there), offset, timestamp, partition, plus the
    decoded key/value with --key-serde/--value-serde; a window store adds window_start/window_end.
    Files are read through statesnap's blob store with their checksums verified (file:// and s3://),
    then merged as docs/reading-checkpoints.md describes: newest row per key wins, tombstones delete.
    Needs DuckDB (pip install 'statesnap[sql]').

    \b
    statesnap sql ./ckpt --table orders "SELECT count(*) FROM orders"
    statesnap sql ./ckpt --table tally --store balances --value-serde json \\
        "SELECT key, value_json FROM balances ORDER BY value_json::INT DESC LIMIT 10" --json
    """
    from statesnap.sql import query_generation

    result = query_generation(
        url,
        table,
        query,
        generation=generation,
        store=store,
        key_serde=key_serde,
        value_serde=value_serde,
        cluster_id=cluster_id,
        storage_options=pairs_to_dict(storage_pairs, "--storage-option"),
    )
    Output(as_json).show(result.to_json(), result.lines())
