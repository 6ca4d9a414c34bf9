"""Every bad input of DESIGN.md and issue 11, as a CLI command: a one-line typed error (exit 1
or 2, no traceback), nothing stored changed (every object hashed before and after), nothing
created in the working directory, and no secret in stdout or stderr — including ``--log-level
debug`` runs with ``?aws_session_token=`` in an S3 URL.

All commands run concurrently (three at a time) from one fixture; each case is then judged by
its own test, against its own copy of a store holding two checkpoints.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from faults.harness import (
    FAKE_SECRET,
    CliResult,
    KafkaTool,
    Location,
    assert_one_line_error,
    file_location,
    judge,
    judge_cli,
    repo_of,
    run_cli_raw,
    s3_location,
    truth_at,
)
from faults.ledger import CaseLedger, is_long
from statesnap import CheckpointOptions, Table
from statesnap.checkpoint import layout
from statesnap.devstack.process import free_port

PARTITIONS = 2


@dataclass(frozen=True)
class Ctx:
    """What a case's command line may refer to."""

    bootstrap: str
    topic: str
    loc: Location  # this case's own copy of the populated store
    tmp: Path
    endpoint: str

    @property
    def url(self) -> str:
        return self.loc.cli_url


@dataclass(frozen=True)
class Case:
    args: Callable[[Ctx], list[str]]
    #: The exception type (or text) the one ``Error:`` line must name; None: must succeed.
    expected: str | None
    store: str = "file"
    env: dict[str, str] = field(default_factory=dict)
    #: A Kafka client deadline is 15 s; anything this much longer is a hang.
    timeout: float = 45.0
    #: Runs that may write (a successful materialize): the store is not compared.
    writes: bool = False
    prepare: Callable[[Location], None] | None = None


def _garble_newest_manifest(loc: Location) -> None:
    repo = repo_of(loc)
    key = repo.key(layout.manifest_key(repo.generations()[0]))
    repo.store.delete([key])
    repo.store.write(key, b'{"format_version": 1, "generation": ')


def _kafka(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--kafka-config", p)]


def _dump(c: Ctx, *extra: str) -> list[str]:
    return ["dump", "-b", c.bootstrap, "-t", c.topic, "--checkpoints", c.url, "--digest", "--json", *extra]


def _materialize(c: Ctx, *extra: str) -> list[str]:
    return ["materialize", "--engine", "python", "-q", "-b", c.bootstrap, "-t", c.topic, *extra]


def _mat_ckpt(c: Ctx, *extra: str) -> list[str]:
    return _materialize(c, "--checkpoints", c.url, *extra)


def _debug(args: list[str]) -> list[str]:
    return ["--log-level", "debug", *args]


def _token_url(c: Ctx) -> str:
    return f"{c.url}&aws_session_token={FAKE_SECRET}"


CASES: dict[str, Case] = {
    # --- URLs ----------------------------------------------------------------------------------
    "malformed-url": Case(lambda c: _materialize(c, "--checkpoints", "s3://[oops/p"), "InvalidStoreUrlError"),
    "unknown-scheme-with-secret": Case(
        lambda c: [*_dump(c)[:5], "--checkpoints", f"gs://b/p?aws_secret_access_key={FAKE_SECRET}"],
        "UnknownSchemeError",
    ),
    "file-url-with-host-and-secret": Case(
        lambda c: _materialize(c, "--checkpoints", f"file://host/p?aws_secret_access_key={FAKE_SECRET}"),
        "UnknownSchemeError",
    ),
    "nothing-before-scheme": Case(
        lambda c: _materialize(c, "--checkpoints", "://nothing"), "UnknownSchemeError"
    ),
    "nul-byte": Case(
        lambda c: _materialize(c, "--checkpoints", f"file://{c.tmp}/ck%00x"), "InvalidStoreUrlError"
    ),
    "proc-root": Case(lambda c: _materialize(c, "--checkpoints", "/proc/ckpt"), "StoreNotWritableError"),
    "empty-url": Case(lambda c: _materialize(c, "--checkpoints", ""), "UnknownSchemeError"),
    "missing-bucket": Case(
        lambda c: [
            "checkpoints",
            "verify",
            f"s3://no-such-{uuid.uuid4().hex[:8]}/p?endpoint_url={c.endpoint}",
        ],
        "MissingBucketError",
        store="s3",
    ),
    "missing-bucket-materialize": Case(
        lambda c: _materialize(
            c, "--checkpoints", f"s3://no-such-{uuid.uuid4().hex[:8]}/p?endpoint_url={c.endpoint}"
        ),
        "MissingBucketError",
        store="s3",
    ),
    "typo-s3-option-with-secret": Case(
        lambda c: _dump(
            c, "--storage-option", f"aws_secret_access_key={FAKE_SECRET}", "--storage-option", "endpont_url=x"
        ),
        "endpont_url",
        store="s3",
    ),
    # --- Kafka ---------------------------------------------------------------------------------
    "unreachable-broker": Case(
        lambda c: [
            "dump",
            "-b",
            f"127.0.0.1:{free_port()}",
            "-t",
            c.topic,
            "--checkpoints",
            c.url,
            "--digest",
        ],
        "BrokerUnavailableError",
    ),
    "unreachable-broker-sasl-debug": Case(
        lambda c: _debug(
            [
                *[
                    "dump",
                    "-b",
                    f"127.0.0.1:{free_port()}",
                    "-t",
                    c.topic,
                    "--checkpoints",
                    c.url,
                    "--digest",
                ],
                *_kafka(
                    "security.protocol=SASL_PLAINTEXT",
                    "sasl.mechanism=PLAIN",
                    "sasl.username=u",
                    f"sasl.password={FAKE_SECRET}",
                ),
            ]
        ),
        "BrokerUnavailableError",
    ),
    "topic-missing": Case(
        lambda c: [
            "dump",
            "-b",
            c.bootstrap,
            "-t",
            f"no-such-{uuid.uuid4().hex[:8]}",
            "--checkpoints",
            c.url,
        ],
        "TopicNotFoundError",
    ),
    "typo-kafka-property": Case(lambda c: _mat_ckpt(c, *_kafka("no.such.prop=1")), "KafkaConfigError"),
    "typo-kafka-env": Case(_mat_ckpt, "KafkaConfigError", env={"STATESNAP_KAFKA_SECURITY_PROTOCOL": "bogus"}),
    "sasl-without-credentials": Case(
        lambda c: _mat_ckpt(c, *_kafka("security.protocol=SASL_SSL", "sasl.mechanism=PLAIN")),
        "KafkaConfigError",
    ),
    "malformed-kafka-config-secret": Case(
        # refused before click parses (cli/argv.py): the entry may be the secret itself
        lambda c: _mat_ckpt(c, *_kafka(f"sasl.password {FAKE_SECRET}")),
        "--kafka-config takes KEY=VALUE",
    ),
    "properties-file-secret-no-user": Case(
        lambda c: _mat_ckpt(c, "--kafka-config-file", str(c.tmp / "client.properties")),
        "KafkaConfigError",
        prepare=None,
    ),
    "missing-properties-file": Case(
        lambda c: _mat_ckpt(c, "--kafka-config-file", str(c.tmp / "nope.properties")),
        "ConfigError: cannot read Kafka properties file",
    ),
    # --- checkpoints and generations ------------------------------------------------------------
    "corrupt-manifest-show": Case(
        lambda c: ["checkpoints", "show", c.url, "--table", c.topic, "2"],
        "CorruptCheckpointError",
        prepare=_garble_newest_manifest,
    ),
    "corrupt-manifests-required": Case(
        lambda c: _dump(c, "--require-checkpoint", "--generation", "2"),
        "NoUsableCheckpointError",
        prepare=_garble_newest_manifest,
    ),
    "generation-zero": Case(lambda c: _dump(c, "--generation", "0"), "Invalid value for '--generation'"),
    "generation-unknown": Case(lambda c: _dump(c, "--generation", "99"), "GenerationNotFoundError"),
    "pin-unknown-generation": Case(
        lambda c: ["snapshot", "pin", c.url, "--table", c.topic, "99"], "NotFoundError"
    ),
    "gc-min-count-zero": Case(
        lambda c: ["checkpoints", "gc", c.url, "--min-count", "0", "--min-age", "0s"],
        "ConfigError: min_count",
    ),
    "negative-interval": Case(
        lambda c: _mat_ckpt(c, "--follow", "--checkpoint-interval", "-5s"), "InvalidDurationError"
    ),
    # --- secrets at debug level (these succeed) -------------------------------------------------
    "debug-list-session-token": Case(
        lambda c: _debug(["checkpoints", "list", _token_url(c), "--table", c.topic, "--json"]),
        None,
        store="s3",
    ),
    "debug-verify-session-token": Case(
        lambda c: _debug(["checkpoints", "verify", _token_url(c)]), None, store="s3"
    ),
    "debug-dump-session-token": Case(
        lambda c: _debug([*_dump(c)[:5], "--checkpoints", _token_url(c), "--digest", "--json"]),
        None,
        store="s3",
    ),
    "debug-materialize-session-token": Case(
        lambda c: _debug(_materialize(c, "--checkpoints", _token_url(c), "--json")),
        None,
        store="s3",
        writes=True,
    ),
}


@dataclass
class Outcome:
    result: CliResult
    before: dict[str, str]
    after: dict[str, str]
    cwd_after: list[str]
    ctx: Ctx


def _checkpointed(kafka: KafkaTool, topic: str, loc: Location) -> None:
    """Two checkpoints (generations 1 and 2) with records after each."""
    for round_no in range(2):
        kafka.produce(
            topic, [(i % PARTITIONS, b"k%d" % (i % 40), b"v%d-%d" % (round_no, i)) for i in range(200)]
        )
        t = Table(
            topic,
            bootstrap_servers=kafka.bootstrap,
            checkpoints=CheckpointOptions(loc.url, storage_options=dict(loc.options)),
            background=False,
        )
        t.start()
        t.close()  # the final checkpoint
    kafka.produce(topic, [(0, b"tail", b"t")])


#: Cases that repeat another's point on a second command: long mode only.
LONG_ONLY = {"missing-bucket-materialize", "debug-verify-session-token", "unreachable-broker"}


def _selected(long_mode: bool) -> list[str]:
    return sorted(n for n in CASES if long_mode or n not in LONG_ONLY)


@pytest.fixture(scope="module")
def outcomes(
    kafka: KafkaTool, s3_server: Any, tmp_path_factory: pytest.TempPathFactory, long_mode: bool
) -> dict[str, Outcome]:
    topic = kafka.create_topic(f"bad-{uuid.uuid4().hex[:10]}", PARTITIONS)
    base = tmp_path_factory.mktemp("bad-inputs")
    templates = {"file": file_location(base / "template")}
    bucket = s3_server.create_bucket(f"bad-{uuid.uuid4().hex[:10]}")
    templates["s3"] = s3_location(s3_server, bucket, "template")
    for loc in templates.values():
        _checkpointed(kafka, topic, loc)

    prepared: dict[str, tuple[Case, Ctx, dict[str, str]]] = {}
    for name in _selected(long_mode):
        case = CASES[name]
        tmp = base / name
        tmp.mkdir()
        (tmp / "cwd").mkdir()
        (tmp / "client.properties").write_text(
            f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.password: {FAKE_SECRET}\n"
        )
        if case.store == "file":
            loc = file_location(tmp / "ckpt")
        else:
            loc = s3_location(s3_server, s3_server.create_bucket(f"bad-{uuid.uuid4().hex[:10]}"))
        templates[case.store].copy(loc)
        if case.prepare is not None:
            case.prepare(loc)
        prepared[name] = (case, Ctx(kafka.bootstrap, topic, loc, tmp, s3_server.endpoint_url), loc.objects())

    def run(name: str) -> tuple[str, Outcome]:
        case, ctx, before = prepared[name]
        result = run_cli_raw(
            case.args(ctx), timeout=case.timeout, env={**ctx.loc.cli_env, **case.env}, cwd=ctx.tmp / "cwd"
        )
        return name, Outcome(
            result, before, ctx.loc.objects(), sorted(p.name for p in (ctx.tmp / "cwd").iterdir()), ctx
        )

    # The slow ones (15 s Kafka deadlines) first, so they overlap with everything else.
    order = sorted(prepared, key=lambda n: "unreachable" not in n)
    with ThreadPoolExecutor(3) as pool:
        return dict(pool.map(run, order))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "name" in metafunc.fixturenames:
        long_mode = is_long(metafunc.config)
        metafunc.parametrize("name", _selected(long_mode))


def test_bad_input(name: str, outcomes: dict[str, Outcome], ledger: CaseLedger, kafka: KafkaTool) -> None:
    ledger.tried("bad_inputs")
    case, out = CASES[name], outcomes[name]
    result = judge_cli(ledger, out.result)  # hangs and leaked secrets first
    if case.expected is None:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        if result.args[-1] == "--json" and "dump" in result.args:
            dumped = json.loads(result.stdout)
            got = truth_at(kafka.read_all(out.ctx.topic, range(PARTITIONS)))
            assert dumped["keys"] == len(got)
            assert dumped["checkpoint"] == 2
    else:
        assert_one_line_error(ledger, result, case.expected)
    if not case.writes:
        changed = {k for k in out.before.keys() | out.after.keys() if out.before.get(k) != out.after.get(k)}
        assert not changed, f"{name} changed the store: {sorted(changed)[:10]}"
    assert out.cwd_after == [], f"{name} created {out.cwd_after} in the working directory"


def test_a_successful_debug_materialize_left_a_restorable_store(
    outcomes: dict[str, Outcome], ledger: CaseLedger, kafka: KafkaTool
) -> None:
    """The one bad-input run that writes (a session token in the URL, at debug level) wrote a
    checkpoint that restores to the independent read."""
    from faults.harness import restore

    out = outcomes["debug-materialize-session-token"]
    expected = truth_at(kafka.read_all(out.ctx.topic, range(PARTITIONS)))
    got = restore(kafka.bootstrap, out.ctx.topic, out.ctx.loc, read_only=True)
    assert got.checkpoint is not None
    assert got.checkpoint >= 3
    judge(ledger, "restore after debug materialize", got.table, expected)
