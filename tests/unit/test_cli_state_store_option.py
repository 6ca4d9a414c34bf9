"""``--state-store`` is the local store kind; on ``materialize`` and ``demo`` its older name
``--store`` still works, hidden from the help and saying once that it is deprecated (everywhere
else ``--store`` names a processor's store). Both given is a usage error in either order."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from statesnap.cli import cli
from statesnap.cli.options import STORE_ALIAS_WARNING, state_store_option


@click.command()
@state_store_option("The local store.", dest="store", default="auto", old_alias=True)
def probe(store: str) -> None:
    click.echo(f"store={store}")


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(probe, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_state_store_is_taken_without_a_warning() -> None:
    assert _run("--state-store", "rocksdb") == (0, "store=rocksdb\n", "")
    assert _run() == (0, "store=auto\n", "")


def test_the_old_name_still_works_and_says_once_it_is_deprecated() -> None:
    code, out, err = _run("--store", "memory")
    assert (code, out) == (0, "store=memory\n")
    assert err.splitlines() == [STORE_ALIAS_WARNING]
    assert STORE_ALIAS_WARNING == "--store is deprecated here: use --state-store"


BOTH = [("--store", "memory", "--state-store", "rocksdb"), ("--state-store", "rocksdb", "--store", "memory")]


@pytest.mark.parametrize("args", BOTH)
def test_both_names_are_refused_in_either_order(args: tuple[str, ...]) -> None:
    code, _, err = _run(*args)
    assert code == 2
    assert "--store and --state-store both given: give --state-store only" in err


@pytest.mark.parametrize("command", ["materialize", "demo"])
def test_the_commands_hide_the_old_name(command: str) -> None:
    """The help shows --state-store only (the old name is mentioned as deprecated in its help)."""
    text = CliRunner().invoke(cli, [command, "--help"]).stdout
    assert "--state-store" in text
    assert "  --store" not in text
    assert "--store, its older name here, is deprecated" in " ".join(text.split())
