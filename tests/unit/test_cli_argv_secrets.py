"""No secret given on the command line is echoed by a usage error (issue 34, item 3).

The shell splits what an operator meant as one ``KEY=VALUE``: ``--kafka-config sasl.password SECRET``
(the ``=`` forgotten) and an unquoted JAAS string both leave a secret as an argument of its own, and
click quoted it ("Got unexpected extra argument (SECRET)"). Every command that takes
``--kafka-config``, ``--storage-option``, ``--to-storage-option`` or ``--spark-conf`` is fed each form
as a user runs it (a fresh process of the venv's interpreter); the secret appears in neither stdout
nor stderr and the error is one line naming the problem. No broker is involved: every form is refused
while the command line is parsed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import click
import pytest

from statesnap.cli import cli
from statesnap.cli.argv import PAIR_OPTIONS, scan

SECRET = "Hunter2Sekrit9q"
PIECE = "xq7SplitPiece4k"
JAAS = (
    "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule",
    "required",
    "username=u",
    f"password={SECRET};",
)


@dataclass(frozen=True, slots=True)
class Form:
    """One way a secret reaches the command line unquoted, and what the error line must say."""

    name: str
    args: tuple[str, ...]
    says: str
    secrets: tuple[str, ...] = (SECRET,)


def forms(option: str) -> list[Form]:
    secret_key = {
        "--kafka-config": "sasl.password",
        "--spark-conf": "spark.hadoop.fs.s3a.secret.key",
    }.get(option, "aws_secret_access_key")
    out = [
        Form("no '='", (option, secret_key, SECRET), f"{option} takes KEY=VALUE: entry 1 has no '='"),
        Form(
            "split value",
            (option, f"{secret_key}=abc", PIECE),
            "Got unexpected extra argument (***) (arguments after a secret",
            (PIECE,),
        ),
    ]
    if option == "--kafka-config":
        out.append(Form("unquoted JAAS", (option, *JAAS), "sasl.jaas.config is cut short"))
    return out


def commands() -> Iterator[tuple[list[str], click.Command]]:
    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    yield from walk(cli, [])


def filled(cmd: click.Command) -> list[str]:
    """Every positional argument and required option of *cmd* given (dummies): the command line
    gets as far as click's extra-argument check."""
    out: list[str] = []
    for param in cmd.params:
        dummy = "1" if isinstance(param.type, click.types.IntParamType) else "dummy"
        if isinstance(param, click.Argument):
            out.append(dummy)
        elif param.required and isinstance(param, click.Option):
            out += [param.opts[0], dummy]
    return out


#: The commands the issue caught echoing: every form through them in the default suite.
NAMED = ({"materialize"}, {"run"}, {"serve"})


def cases(every_form: bool) -> list[tuple[str, list[str], Form]]:
    """Each (command, option, form): with *every_form* all of them, else the forgotten '=' through
    every command and every form through the commands the issue named."""
    out = []
    for path, cmd in commands():
        taken = {opt for param in cmd.params for opt in param.opts if opt in PAIR_OPTIONS}
        for option in sorted(taken):
            for n, form in enumerate(forms(option)):
                if every_form or n == 0 or set(path) in NAMED:
                    out.append(
                        (f"{' '.join(path)} {option} {form.name}", [*path, *filled(cmd), *form.args], form)
                    )
    return out


def run_cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statesnap.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "STATESNAP_TIMEOUT": "1s"},
    )


@pytest.mark.parametrize(
    "every_form",
    [False, pytest.param(True, marks=pytest.mark.long, id="every-form-everywhere")],
)
def test_every_command_refuses_unquoted_secrets_without_echoing_them(every_form: bool) -> None:
    """The forms through every command taking pair options: exit 2, no secret anywhere, and the
    output's one error line names the problem (before the fix: "Got unexpected extra argument
    (Hunter2Sekrit9q)", or the JAAS ``password=`` piece quoted the same way). The default run: the
    forgotten '=' through every command, every form through materialize, run and serve (~45
    processes); the long variant: every form through every command (~90)."""
    all_cases = cases(every_form)
    names = {name.split(" --")[0] for name, _, _ in all_cases}
    assert {"materialize", "run", "serve", "dump", "produce-sample", "snapshot clone", "sql"} <= names
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda case: run_cli(case[1]), all_cases))
    failures = []
    for (name, _, form), result in zip(all_cases, results, strict=True):
        output = result.stdout + result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        problems = []
        if result.returncode != 2:
            problems.append(f"exit {result.returncode}")
        if any(secret in output for secret in form.secrets):
            problems.append("secret echoed")
        if len(errors) != 1 or form.says not in errors[0]:
            problems.append(f"error lines {errors}")
        if problems:
            failures.append(f"{name}: {'; '.join(problems)}\n{result.stderr}")
    assert not failures, "\n".join(failures)


def test_a_positional_argument_that_swallowed_a_piece_is_masked_in_the_typed_error() -> None:
    """``run --kafka-config sasl.password=abc PIECE`` takes the piece as MODULE:OBJECT, and
    ``checkpoints list --storage-option aws_secret_access_key=abc PIECE`` as the store's URL; the
    typed errors naming them mask them (inside the URL too) and say why."""
    ran = run_cli(["run", "--kafka-config", "sasl.password=abc", PIECE])
    listed = run_cli(
        ["checkpoints", "list", "--storage-option", "aws_secret_access_key=abc", PIECE, "--table", "t"]
    )
    for result, starts in (
        (ran, "Error: ConfigError: '***' is not MODULE:OBJECT"),
        (listed, "Error: TableNotFoundError: no checkpoints of table 't' under ***"),
    ):
        assert result.returncode == 1
        assert PIECE not in result.stdout + result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(starts), line
        assert "arguments after a secret --" in line
        assert "value are not shown" in line


@pytest.mark.parametrize(
    ("args", "malformed", "hidden"),
    [
        (
            ["-b", "x", "--kafka-config", "sasl.password", "S3cret"],
            "--kafka-config",
            {"sasl.password", "S3cret"},
        ),
        (["--kafka-config=sasl.password"], "--kafka-config", {"sasl.password"}),
        (["--kafka-config", "=v"], "--kafka-config", {"=v"}),
        (["--kafka-config", "sasl.password=a", "b c", "--topic", "t"], None, {"sasl.password=a", "b c"}),
        (["--kafka-config", "security.protocol=SSL", "x"], None, set()),
        (["--storage-option", "region=eu", "--storage-option", "k"], "--storage-option", {"k"}),
        (["--", "--kafka-config", "nope"], None, set()),
        (["--kafka-config"], None, set()),
    ],
)
def test_scan(args: list[str], malformed: str | None, hidden: set[str]) -> None:
    """Which entries are refused before parsing and which arguments are never shown."""
    found = scan(args)
    assert (found.malformed.option if found.malformed else None) == malformed
    assert {token for token, _ in found.hidden} == hidden


def test_hide_masks_short_arguments_as_whole_words_only() -> None:
    found = scan(["--kafka-config", "sasl.password=abc", "u", "pw;", "longer-piece"])
    assert found.hide("Got unexpected extra arguments (u pw; longer-piece)").startswith(
        "Got unexpected extra arguments (*** *** ***) (arguments after a secret --kafka-config value"
    )
    assert found.hide("under file:///tmp/longer-piece").startswith("under file:///tmp/*** (")
    assert found.hide("nothing unusual") == "nothing unusual"
