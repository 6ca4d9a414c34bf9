"""The ``statesnap`` command.

Every command has ``--help``; options also come from ``STATESNAP_*`` environment variables; errors
are one line on stderr with a non-zero exit code (1 for statesnap errors, 2 for usage errors).

Loading the CLI registers every command without importing the engines (pyarrow, numpy, Kafka's
client, Spark, FastAPI, rich): a command imports what it uses when it runs, so ``--help`` and the
light commands start in a fraction of the time (tests/unit/test_cli_startup.py holds to it).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from statesnap import __version__
from statesnap.cli.argv import ArgvSecrets, malformed_message, scan
from statesnap.cli.docs import docs_page
from statesnap.errors import StatesnapError
from statesnap.redaction import install_log_redaction, scrub

__all__ = ["EXAMPLES", "OneLineFormatter", "StatesnapGroup", "cli", "main"]

EXAMPLES = """
\b
Quick start (embedded broker, local checkpoints):
  statesnap broker --port 9092 &
  statesnap produce-sample -b 127.0.0.1:9092 -t orders --keys 1000 --updates 100000
  statesnap materialize    -b 127.0.0.1:9092 -t orders --checkpoints ./ckpt
  statesnap dump           -b 127.0.0.1:9092 -t orders --checkpoints ./ckpt --digest --json
  statesnap checkpoints list ./ckpt --table orders
  statesnap run tally:proc --follow   # a Processor built in tally.py (see run --help)
  statesnap demo           # the whole story in one command
"""


class StatesnapGroup(click.Group):
    """Turns statesnap's typed errors into one-line messages instead of tracebacks, and keeps
    secrets given on the command line out of every message click or a command prints.

    Before click parses anything, the arguments are scanned (:mod:`statesnap.cli.argv`): a
    ``--kafka-config``/``--storage-option`` entry without ``=`` is refused unseen, and the pieces
    of a secret value the shell split are remembered; every error on the way out (usage errors,
    bad parameters, typed errors) is scrubbed and has those pieces masked."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        found = scan(args)
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:
            raise _hidden(e, found) from None
        ctx.meta[_ARGV_SECRETS] = found
        return ctx

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        found = scan(args)
        if found.malformed is not None and not ctx.resilient_parsing:
            # Before click reads any argument: the pieces after the entry would be quoted as
            # unexpected extra arguments or taken as a positional one.
            raise click.UsageError(malformed_message(found.malformed), ctx)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        found = ctx.meta.get(_ARGV_SECRETS, ArgvSecrets())
        try:
            return super().invoke(ctx)
        except StatesnapError as e:
            # The last line a user sees: scrubbed again, whichever module built the message.
            raise click.ClickException(f"{type(e).__name__}: {found.hide(str(e))}") from e
        except click.ClickException as e:
            raise _hidden(e, found) from None


_ARGV_SECRETS = "statesnap.argv_secrets"


def _hidden(error: click.ClickException, found: ArgvSecrets) -> click.ClickException:
    """*error* with its message scrubbed and the command line's hidden arguments masked (the same
    error when nothing changes; else a usage error for a usage error, usage line and exit code 2
    kept, and a plain one, exit code 1, for the rest: click's errors all exit 1 or 2)."""
    text = error.format_message()
    clean = found.hide(text)
    if clean == text:
        return error
    if isinstance(error, click.UsageError):
        return click.UsageError(clean, error.ctx)
    return click.ClickException(clean)


@docs_page("index.md")
@click.group(
    cls=StatesnapGroup,
    epilog=EXAMPLES,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "auto_envvar_prefix": "STATESNAP",
        "max_content_width": 110,
    },
)
@click.version_option(__version__, prog_name="statesnap")
@click.option(
    "--log-level",
    default="WARNING",
    show_default=True,
    envvar="STATESNAP_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log level for statesnap's logs on stderr.",
)
def cli(log_level: str) -> None:
    """statesnap: Kafka tables that boot from checkpoints instead of replaying all history.

    A table is the latest value per key of a topic. statesnap writes periodic checkpoints of it to
    a blob store (a directory or s3://bucket/prefix), and restores from the newest valid one plus
    the topic's tail — so start-up cost follows the table's size, not the history's length.
    """
    handler = _log_handler()
    if log_level.upper() != "DEBUG":
        handler.addFilter(_typed_errors_in_one_line)
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    install_log_redaction()  # secrets never reach a log line, whoever logs (botocore, urllib3, …)
    logging.getLogger("statesnap").setLevel(log_level.upper())
    # librdkafka reports every failed connection attempt; the typed error after the timeout says it
    # once. Its lines show at DEBUG.
    logging.getLogger("statesnap.librdkafka").setLevel(
        logging.DEBUG if log_level.upper() == "DEBUG" else logging.CRITICAL
    )


class OneLineFormatter(logging.Formatter):
    """One record, one line: a log shipper reading a pipe or file splits records at newlines, so
    a traceback's or a message's own newlines are written as ``\\n``; nothing is wrapped."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", "\\n")


def _typed_errors_in_one_line(record: logging.LogRecord) -> bool:
    """A statesnap error logged with its traceback shows as its one line (tracebacks at DEBUG):
    its message already names what is wrong, and the command's own error line follows."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, StatesnapError):
        record.msg, record.args = f"{record.getMessage()}: {type(error).__name__}: {error}", ()
        record.exc_info, record.exc_text = None, None
    return True


def _log_handler() -> logging.Handler:
    """rich's handler on a terminal (a person reads it); plain lines everywhere else — rich wraps
    at 80 columns when stderr is not a terminal, breaking URLs and records mid-word."""
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        from statesnap.cli.progress import stderr

        return RichHandler(console=stderr, show_path=False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def _register() -> None:
    from statesnap.cli import broker, checkpoints, demo, run, sample, serve, snapshot, tables
    from statesnap.cli.sql import sql

    cli.add_command(broker.broker)
    cli.add_command(sample.produce_sample_cmd)
    cli.add_command(tables.materialize)
    cli.add_command(tables.dump)
    cli.add_command(run.run)
    cli.add_command(checkpoints.checkpoints)
    cli.add_command(snapshot.snapshot)
    cli.add_command(serve.serve)
    cli.add_command(demo.demo)
    cli.add_command(sql)


_register()


def main() -> None:
    """Console-script entry point.

    Every command has closed what it opened by the time it returns (tables, stores, Spark), so the
    process ends with ``os._exit``: native libraries' threads (Arrow's pools) torn down during
    interpreter finalization could otherwise abort a finished command ("terminate called without
    an active exception", exit 134) after it printed a correct result.
    """
    code: int = 0
    try:
        cli.main(prog_name="statesnap")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(scrub(e.code), file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
