"""The pipeline as a Spark job: ``python -m statesnap.spark`` or ``spark-submit`` of this file.

It takes exactly the options of ``statesnap materialize --engine spark`` (the CLI's own option
definitions; ``--engine`` accepts only ``spark`` here) plus ``--log-level``::

    python -m statesnap.spark -b broker:9092 -t orders --checkpoints s3://bucket/ckpt --json
    spark-submit --master spark://host:7077 --conf spark.pyspark.python=/opt/venv/bin/python \\
        "$(python -c 'import statesnap.spark.__main__ as m; print(m.__file__)')" \\
        -b broker:9092 -t orders --checkpoints s3://bucket/ckpt --follow

spark-submit has no ``-m``: its primary resource is a file, and this one is it. Under spark-submit
the submitted settings rule (``--master``, ``--conf``, ``--py-files``, ``--archives``): the master
the JVM was submitted with is used, not ``STATESNAP_SPARK_MASTER``. docs/spark-cluster.md says how
to ship statesnap to the executors.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file (spark-submit): Python put this directory first on sys.path, where the
    # package's modules (session.py, options.py, source.py, …) would shadow top-level modules.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _here]

import logging
import os
from collections.abc import Sequence
from typing import Any

import click

from statesnap.errors import StatesnapError
from statesnap.redaction import scrub

log = logging.getLogger("statesnap.spark.main")

PROG = "python -m statesnap.spark"


class _SparkJob(click.Command):
    """statesnap's typed errors as one line (exit 1), like the ``statesnap`` command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StatesnapError as e:
            # Scrubbed again, whichever module built the message (as the statesnap command does).
            raise click.ClickException(f"{type(e).__name__}: {scrub(str(e))}") from e


def submitted_master() -> str | None:
    """The master spark-submit started this driver's JVM with (None outside spark-submit).

    spark-submit runs a Python application with ``PYSPARK_GATEWAY_PORT`` set and its settings
    as the JVM's ``spark.*`` properties; a session builder that sets a master of its own would
    override ``--master`` with ``local[*]``.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # attach to spark-submit's JVM, whose properties hold --master
    master = SparkConf().get("spark.master", None)
    return str(master) if master else None


def build_command() -> click.Command:
    """``materialize``'s parameters (``--engine`` narrowed to ``spark``) and the CLI's
    ``--log-level``, calling the same callbacks the ``statesnap`` command calls."""
    from statesnap.cli import cli as statesnap_cli
    from statesnap.cli.tables import materialize

    engine = click.Option(
        ["--engine"],
        type=click.Choice(["spark"]),
        default="spark",
        show_default=True,
        help="Always spark here; use `statesnap materialize` for the python engine.",
    )
    params = [engine if p.name == "engine" else p for p in materialize.params]
    params += [p for p in statesnap_cli.params if p.name == "log_level"]

    def run(log_level: str, **options: Any) -> None:
        ctx = click.get_current_context()
        assert statesnap_cli.callback is not None
        assert materialize.callback is not None
        ctx.invoke(statesnap_cli.callback, log_level=log_level)
        ctx.invoke(materialize.callback, **options)

    return _SparkJob(
        PROG,
        params=params,
        callback=run,
        help="Bootstrap (or with --follow continuously materialize) TOPIC's table into checkpoints "
        "as a Spark job. Same options as `statesnap materialize --engine spark`; the master comes "
        "from spark-submit --master, else STATESNAP_SPARK_MASTER, else local[*].",
        epilog=materialize.epilog,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: adopt spark-submit's master, then run the command (exit codes as the CLI's)."""
    from statesnap.spark.session import MASTER_ENV

    master = submitted_master()
    if master is not None:
        configured = os.environ.get(MASTER_ENV)
        if configured and configured != master:
            log.warning("using spark-submit's master %s, not %s=%s", master, MASTER_ENV, configured)
        os.environ[MASTER_ENV] = master
    try:
        build_command().main(
            args=list(argv) if argv is not None else None,
            prog_name=PROG,
            auto_envvar_prefix="STATESNAP_MATERIALIZE",
        )
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
