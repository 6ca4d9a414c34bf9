"""Secrets in URLs stay secret (issue 22): every URL form a user may paste credentials into, walked
through ``checkpoints verify``, ``materialize`` and ``dump`` as a user runs them (a fresh
``statesnap`` process each), and the secret never appears on stdout or stderr, ``--json`` included.

The forms: userinfo with and without a password, percent-encoded, ``@`` and ``/`` in the password
(AWS secret keys hold ``/`` and ``+``), ``s3a://``, http and https ``endpoint_url`` with userinfo
(as a URL option and as ``--storage-option``), query-string secrets (``?aws_secret_access_key=``,
``?aws_session_token=``) against the real endpoint, a secret pasted where a setting goes
(``endpoint_url=``, ``connect_timeout=``, a librdkafka value), broker lists with userinfo (plain,
with ``SASL_SSL://`` schemes, inside ``--kafka-config bootstrap.servers=``). Before the fix,
``checkpoints verify 's3://KEY:SECRET@bucket/p'`` printed key and secret twice, and an endpoint's
``user:SECRET@`` came back in "Could not connect to the endpoint URL".

Each form counts once in the fault summary's "url forms tried". Broker behaviour: the forms that
reach Kafka run against the fault suite's broker (Apache Kafka); what they prove (the broker list is
refused before any connection) does not depend on the broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from faults.harness import CliResult, KafkaTool, judge_cli, run_cli_raw
from faults.ledger import CaseLedger
from statesnap.devstack.s3 import DEV_CREDENTIALS

KEY_ID = "AKIAURLFORMS3X7Q9ZPL"
#: Shaped like an AWS secret key: '/' and '+' inside, which split a URL where no parser expects.
SECRET_KEY = "wJalrXUtnURLFORMS/K7MDENG+bPxRfiCYzz"
PASSWORD = "urlforms-Pa55word-41c"
AT_PASSWORD = "urlforms@Pa55@w0rd"
TOKEN = "urlforms-TOKEN-6d1f0b9e"
SECRETS = (KEY_ID, SECRET_KEY, PASSWORD, AT_PASSWORD, TOKEN)


def fragments(secret: str) -> set[str]:
    """What must not appear of *secret*: itself, its percent-encodings, and every piece of it
    between separators that a parser might split at ('/', '+', '@') long enough to recognise."""
    out = {secret, quote(secret, safe=""), quote(secret, safe="/:@")}
    for sep in "/+@":
        out |= {part for part in secret.split(sep) if len(part) >= 6}
    return out


FRAGMENTS = sorted({f for s in SECRETS for f in fragments(s)}, key=len, reverse=True)


@dataclass(frozen=True)
class Ctx:
    bootstrap: str
    topic: str
    endpoint: str  # the real S3 endpoint (moto)
    bucket: str  # an existing bucket on it
    file_url: str  # a good checkpoint location for the forms that are about Kafka

    @property
    def port(self) -> str:
        return self.endpoint.rsplit(":", 1)[1]


@dataclass(frozen=True)
class Form:
    """A URL form: the checkpoint URL and extra arguments it gives, or a broker list."""

    url: Callable[[Ctx], str] | None = None
    extra: Callable[[Ctx], list[str]] = lambda c: []
    bootstrap: Callable[[Ctx], str] | None = None
    #: Commands this form goes through (broker forms need a broker: not ``verify``).
    commands: tuple[str, ...] = ("verify", "materialize", "dump")
    #: Run at ``--log-level debug``: botocore's and librdkafka's records pass the log filter.
    debug: bool = False


def _s3(userinfo: str, scheme: str = "s3") -> Callable[[Ctx], str]:
    return lambda c: f"{scheme}://{userinfo}@{c.bucket}/forms"


def _on_endpoint(**query: str) -> Callable[[Ctx], str]:
    """The real bucket, with *query* options (values percent-encoded as a careful user would)."""
    return lambda c: (
        f"s3://{c.bucket}/forms?"
        + "&".join(
            f"{k}={quote(v.format(endpoint=c.endpoint, port=c.port), safe='')}" for k, v in query.items()
        )
    )


_BROKER_ONLY = ("materialize", "dump")

FORMS: dict[str, Form] = {
    # --- credentials in an s3:// URL --------------------------------------------------------------
    "s3-key-and-secret": Form(_s3(f"{KEY_ID}:{PASSWORD}")),
    "s3-aws-secret-with-slash-and-plus": Form(_s3(f"{KEY_ID}:{SECRET_KEY}")),
    "s3-userinfo-without-password": Form(_s3(TOKEN)),
    "s3-percent-encoded-secret": Form(_s3(f"{KEY_ID}:{quote(SECRET_KEY, safe='')}")),
    "s3-at-in-password": Form(_s3(f"{KEY_ID}:{AT_PASSWORD}")),
    "s3a-key-and-secret": Form(_s3(f"{KEY_ID}:{PASSWORD}", scheme="s3a")),
    # --- endpoint URLs with userinfo ----------------------------------------------------------------
    "endpoint-http-userinfo-option": Form(
        _on_endpoint(endpoint_url=f"http://{KEY_ID}:{PASSWORD}@127.0.0.1:{{port}}")
    ),
    "endpoint-https-userinfo-option": Form(
        _on_endpoint(endpoint_url=f"https://{KEY_ID}:{PASSWORD}@127.0.0.1:{{port}}")
    ),
    "endpoint-token-userinfo-option": Form(_on_endpoint(endpoint_url=f"http://{TOKEN}@127.0.0.1:{{port}}")),
    "endpoint-userinfo-storage-option": Form(
        lambda c: f"s3://{c.bucket}/forms",
        lambda c: ["--storage-option", f"endpoint_url=http://u:{AT_PASSWORD}@127.0.0.1:{c.port}"],
    ),
    "endpoint-userinfo-unencoded-in-url": Form(
        lambda c: f"s3://{c.bucket}/forms?endpoint_url=http://{KEY_ID}:{PASSWORD}@127.0.0.1:{c.port}"
    ),
    # --- query-string secrets against the real endpoint (these may succeed) ---------------------
    "query-secret-access-key": Form(
        _on_endpoint(
            endpoint_url="{endpoint}",
            region="us-east-1",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET_KEY,
        )
    ),
    "query-session-token": Form(
        _on_endpoint(
            endpoint_url="{endpoint}",
            aws_access_key_id=DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=PASSWORD,
            aws_session_token=TOKEN,
        )
    ),
    "query-secret-access-key-debug": Form(
        _on_endpoint(
            endpoint_url="{endpoint}",
            region="us-east-1",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET_KEY,
            aws_session_token=TOKEN,
        ),
        debug=True,
    ),
    # --- other schemes ------------------------------------------------------------------------------
    "https-checkpoint-url-userinfo": Form(lambda c: f"https://{KEY_ID}:{PASSWORD}@example.invalid/ckpt"),
    "file-url-userinfo": Form(lambda c: f"file://{KEY_ID}:{PASSWORD}@localhost/tmp/ckpt"),
    # --- a secret pasted where a setting goes ----------------------------------------------------
    "endpoint-is-a-pasted-secret": Form(_on_endpoint(endpoint_url=SECRET_KEY)),
    "timeout-is-a-pasted-secret": Form(_on_endpoint(endpoint_url="{endpoint}", connect_timeout=PASSWORD)),
    # --- broker lists -------------------------------------------------------------------------------
    "broker-userinfo": Form(bootstrap=lambda c: f"{KEY_ID}:{PASSWORD}@{c.bootstrap}", commands=_BROKER_ONLY),
    "broker-list-with-schemes": Form(
        bootstrap=lambda c: f"{c.bootstrap},SASL_SSL://u:{AT_PASSWORD}@{c.bootstrap},PLAINTEXT://{TOKEN}@h:1",
        commands=_BROKER_ONLY,
    ),
    "broker-in-kafka-config": Form(
        extra=lambda c: ["--kafka-config", f"bootstrap.servers=u:{PASSWORD}@{c.bootstrap}"],
        commands=_BROKER_ONLY,
    ),
    "broker-userinfo-debug": Form(
        bootstrap=lambda c: f"SASL_SSL://{KEY_ID}:{SECRET_KEY}@{c.bootstrap}",
        commands=_BROKER_ONLY,
        debug=True,
    ),
    "kafka-config-value-is-a-pasted-secret": Form(
        extra=lambda c: ["--kafka-config", f"fetch.wait.max.ms={PASSWORD}"], commands=_BROKER_ONLY
    ),
}


def _args(command: str, form: Form, c: Ctx) -> list[str]:
    url = form.url(c) if form.url is not None else c.file_url
    bootstrap = form.bootstrap(c) if form.bootstrap is not None else c.bootstrap
    extra = form.extra(c)
    debug = ["--log-level", "debug"] if form.debug else []
    return [*debug, *_command(command, url, bootstrap, c.topic, extra)]


def _command(command: str, url: str, bootstrap: str, topic: str, extra: list[str]) -> list[str]:
    if command == "verify":
        return ["checkpoints", "verify", url, "--json", *extra]
    if command == "materialize":
        return [
            "materialize",
            "--engine",
            "python",
            "-q",
            "-b",
            bootstrap,
            "-t",
            topic,
            "--checkpoints",
            url,
            "--json",
            *extra,
        ]
    return ["dump", "-b", bootstrap, "-t", topic, "--checkpoints", url, "--digest", "--json", *extra]


@pytest.fixture(scope="module")
def outcomes(
    kafka: KafkaTool, s3_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[CliResult]]:
    """Every form through its commands, three processes at a time (on two cores, the runs are
    bound by interpreter start-up)."""
    topic = kafka.create_topic(f"ufx-{uuid.uuid4().hex[:10]}", 1)
    kafka.produce(topic, [(0, b"k%d" % i, b"v%d" % i) for i in range(20)])
    base: Path = tmp_path_factory.mktemp("ufx")
    ctx = Ctx(
        kafka.bootstrap,
        topic,
        s3_server.endpoint_url,
        s3_server.create_bucket(f"ufx-{uuid.uuid4().hex[:10]}"),
        (base / "ckpt").as_uri(),
    )
    # The credentials a user has in the environment; the forms' own take over where given.
    env = {**DEV_CREDENTIALS}
    runs = [(name, cmd) for name, form in FORMS.items() for cmd in form.commands]

    def run(job: tuple[str, str]) -> tuple[str, CliResult]:
        name, cmd = job
        return name, run_cli_raw(_args(cmd, FORMS[name], ctx), timeout=60, env=env, cwd=base)

    out: dict[str, list[CliResult]] = {name: [] for name in FORMS}
    with ThreadPoolExecutor(3) as pool:
        for name, result in pool.map(run, runs):
            out[name].append(result)
    return out


def _masked(text: str) -> str:
    for fragment in FRAGMENTS:
        text = text.replace(fragment, "<SECRET>")
    return text


def _leaked(text: str) -> str | None:
    """The first output line holding a fragment of a secret, every fragment in it masked."""
    for line in text.splitlines():
        if any(fragment in line for fragment in FRAGMENTS):
            return _masked(line)[:300]
    return None


@pytest.mark.parametrize("name", list(FORMS))
def test_url_form_never_shows_its_secret(
    name: str, outcomes: dict[str, list[CliResult]], ledger: CaseLedger
) -> None:
    ledger.tried("url_forms")
    for result in outcomes[name]:
        judge_cli(ledger, result)  # hangs, and the suite's own secrets
        # Named by form and command only: the arguments hold the secrets.
        what = f"statesnap {' '.join(a for a in result.args[:4] if a.isalpha())} ({name})"
        leak = _leaked(result.output)
        ledger.check(leak is None, "secret_leaks", f"{what}: {leak}")
        assert "Traceback" not in result.stderr, f"{what}\n{_masked(result.stderr[-2000:])}"
        if result.returncode != 0:
            errors = result.error_lines()
            assert len(errors) == 1, f"{what}: want one 'Error:' line\n{_masked(result.stderr[-2000:])}"


def test_the_forms_that_carry_credentials_are_refused_by_name(outcomes: dict[str, list[CliResult]]) -> None:
    """s3:// userinfo, endpoint userinfo and broker-list userinfo are refused up front with a typed
    one-line error that says where credentials go (the choice made: never accepted from a URL)."""
    expected = {
        "s3-key-and-secret": "InvalidStoreUrlError",
        "s3-userinfo-without-password": "InvalidStoreUrlError",
        "s3-at-in-password": "InvalidStoreUrlError",
        "s3-aws-secret-with-slash-and-plus": "InvalidStoreUrlError",
        "endpoint-http-userinfo-option": "InvalidStoreUrlError",
        "endpoint-userinfo-storage-option": "InvalidStoreUrlError",
        "endpoint-is-a-pasted-secret": "InvalidStoreUrlError",
        "timeout-is-a-pasted-secret": "InvalidStoreUrlError",
        "broker-userinfo": "ConfigError",
        "broker-in-kafka-config": "ConfigError",
    }
    for name, error in expected.items():
        for result in outcomes[name]:
            assert result.returncode == 1, (name, _masked(result.output[-1000:]))
            (line,) = result.error_lines()
            assert line.startswith(f"Error: {error}:"), (name, _masked(line))
            assert "not shown" in line, (name, _masked(line))
