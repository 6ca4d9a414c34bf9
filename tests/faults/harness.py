"""Tools the fault tests share: checkpoint locations seen from outside statesnap, a CLI runner
that turns a hang into a finding, a background producer, and the ground-truth model.

Ground truth never comes from statesnap: records are read back with a plain confluent-kafka
consumer to partition EOF (:class:`KafkaTool` of tests/integration/conftest.py), stores are
listed and hashed with the filesystem or boto3 directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.ledger import CaseLedger
from integration.conftest import KafkaTool, Rec
from statesnap import CheckpointOptions
from statesnap.blob import BlobStore, open_blob_store
from statesnap.checkpoint import CheckpointManifest, CheckpointRepository, layout

__all__ = ["KafkaTool", "Rec"]

STATESNAP = [sys.executable, "-m", "statesnap.cli"]
#: A distinctive fake secret: any occurrence in any output is a leak.
FAKE_SECRET = "FAULTSECRET-9f3c1e7a5b"
#: The dev S3 credentials are real secrets as far as statesnap knows: they must not leak either.
DEV_SECRET = "statesnap-dev-secret"
SECRETS = (FAKE_SECRET, DEV_SECRET)


# --- checkpoint locations, seen from outside ---------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A checkpoint root on ``file`` or ``s3`` with everything needed to use it and inspect it.

    ``cli_url`` carries the endpoint as a URL option and ``cli_env`` the credentials, as a user
    would pass them; ``url`` + ``options`` are for the Python API.
    """

    kind: str
    url: str
    options: Mapping[str, str]
    cli_url: str
    cli_env: Mapping[str, str]
    root: Path | None = None
    bucket: str = ""
    prefix: str = ""
    s3: Any = None  # a boto3 client for inspection (never statesnap's)

    def store(self) -> BlobStore:
        return open_blob_store(self.url, **self.options)

    def objects(self) -> dict[str, str]:
        """Every object under the root (directories too, for ``file``) and its SHA-256."""
        out: dict[str, str] = {}
        if self.kind == "file":
            assert self.root is not None
            if not self.root.exists():
                return out
            for p in sorted(self.root.rglob("*")):
                rel = p.relative_to(self.root).as_posix()
                out[rel + "/" if p.is_dir() else rel] = (
                    "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
                )
            return out
        for key in self.s3_keys():
            body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            out[key] = hashlib.sha256(body).hexdigest()
        for up in self.uploads():
            out[f"(upload) {up}"] = "upload"
        return out

    def list_keys(self) -> list[str]:
        """File keys relative to the root, cheaply (no contents): for polling."""
        if self.kind == "file":
            assert self.root is not None
            if not self.root.exists():
                return []
            # os.walk, not rglob: a writer's GC removes directories while we list (no error).
            return [
                (Path(d) / f).relative_to(self.root).as_posix()
                for d, _, files in os.walk(self.root)
                for f in files
            ]
        n = len(self.prefix) + 1 if self.prefix else 0
        return [k[n:] for k in self.s3_keys()]

    def s3_keys(self) -> list[str]:
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def uploads(self) -> list[str]:
        """Multipart uploads in progress (S3 only)."""
        if self.kind != "s3":
            return []
        answer = self.s3.list_multipart_uploads(Bucket=self.bucket)
        return [f"{u['Key']}#{u['UploadId']}" for u in answer.get("Uploads", [])]

    def table_keys(self) -> dict[str, set[str]]:
        """Keys per table directory, relative to it (files only)."""
        out: dict[str, set[str]] = {}
        for key in self.objects():
            if key.startswith("(upload)") or key.endswith("/"):
                continue
            rel = key[len(self.prefix) + 1 :] if self.kind == "s3" and self.prefix else key
            table, _, rest = rel.partition("/")
            out.setdefault(table, set()).add(rest)
        return out

    def copy(self, target: Location) -> None:
        """Copy every object into *target* (a fresh, empty location of the same kind)."""
        if self.kind == "file":
            assert self.root is not None
            assert target.root is not None
            import shutil

            shutil.copytree(self.root, target.root)
            return
        for key in self.s3_keys():
            if not key.startswith(self.prefix + "/"):
                continue
            dest = target.prefix + key[len(self.prefix) :]
            self.s3.copy_object(
                Bucket=target.bucket, Key=dest, CopySource={"Bucket": self.bucket, "Key": key}
            )


def file_location(root: Path) -> Location:
    return Location("file", root.as_uri(), {}, root.as_uri(), {}, root=root)


def s3_location(s3_server: Any, bucket: str, prefix: str = "ckpt") -> Location:
    from statesnap.devstack.s3 import DEV_CREDENTIALS

    options = s3_server.storage_options()
    env = dict(DEV_CREDENTIALS.items())
    return Location(
        "s3",
        f"s3://{bucket}/{prefix}",
        options,
        f"s3://{bucket}/{prefix}?endpoint_url={s3_server.endpoint_url}",
        env,
        bucket=bucket,
        prefix=prefix,
        s3=s3_server.client(),
    )


def repo_of(loc: Location) -> CheckpointRepository:
    store = loc.store()
    (directory,) = store.list_dirs("")
    return CheckpointRepository(store, directory)


# --- running the CLI ---------------------------------------------------------------------------


@dataclass
class CliResult:
    args: Sequence[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    hung: bool = False
    timeout: float = 0.0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> Any:
        return json.loads(self.stdout)

    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("Error:")]


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STATESNAP_", "AWS_"))}
    env["COLUMNS"] = "200"  # one logical line stays one physical line
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT on a hang dumps every thread's stack (dump_stacks)
    env.update(extra or {})
    return env


def materialize_args(bootstrap: str, topic: str, loc: Location, *extra: str) -> list[str]:
    """The writer every fault test runs: ``materialize`` on the Python engine into *loc*, quiet."""
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
        loc.cli_url,
        *extra,
    ]


def start_cli(args: Sequence[str], loc: Location, log: Path) -> subprocess.Popen[bytes]:
    """``statesnap ARGS`` in the background, in its own process group (so a test can stop it as a
    terminal would), its output appended to *log*."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [*STATESNAP, *args], stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=cli_env(loc.cli_env),
            start_new_session=True,
        )  # fmt: skip


def run_cli_raw(
    args: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> CliResult:
    """Run ``statesnap ARGS`` in its own process group; past *timeout* it is killed and the
    result says ``hung`` (judged by the caller, possibly on another thread)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [*STATESNAP, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=cli_env(env),
        cwd=cwd,
        start_new_session=True,
    )
    hung = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        hung = True
        os.kill(proc.pid, signal.SIGABRT)  # faulthandler: the stacks go to its stderr
        time.sleep(1)
        kill_group(proc)
        out, err = proc.communicate()
    return CliResult(args, proc.returncode, out, err, time.monotonic() - started, hung, timeout)


def judge_cli(ledger: CaseLedger, result: CliResult) -> CliResult:
    """Fail (and record) a hang or a secret in the output."""
    what = f"statesnap {' '.join(result.args)}"
    check_secrets(ledger, result.output, what)
    if result.hung:
        ledger.fail("hangs", f"`{what}` still running after {result.timeout:.0f}s; {result.stderr[-300:]!r}")
    return result


def run_cli(
    ledger: CaseLedger,
    args: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> CliResult:
    """Run ``statesnap ARGS``; a hang or a leaked secret is recorded and fails the test."""
    return judge_cli(ledger, run_cli_raw(args, timeout=timeout, env=env, cwd=cwd))


def check_secrets(ledger: CaseLedger, text: str, what: str) -> None:
    for secret in SECRETS:
        if secret in text:
            line = next(line for line in text.splitlines() if secret in line)
            ledger.fail("secret_leaks", f"{what}: {line.replace(secret, '<SECRET>')[:200]}")


def dump_stacks(proc: subprocess.Popen[Any]) -> None:
    """Before killing a hung process: SIGABRT makes faulthandler print every thread's stack."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def assert_one_line_error(ledger: CaseLedger, result: CliResult, expected: str) -> None:
    """Exit 1 or 2, exactly one ``Error:`` line naming *expected*, no traceback."""
    where = f"`statesnap {' '.join(result.args)}` (exit {result.returncode})"
    assert result.returncode in (1, 2), f"{where}: expected a failure\n{result.output[-2000:]}"
    assert "Traceback" not in result.stderr, f"{where}: traceback\n{result.stderr[-3000:]}"
    assert "terminate called" not in result.stderr, f"{where}: native abort\n{result.stderr[-2000:]}"
    errors = result.error_lines()
    assert len(errors) == 1, f"{where}: want one 'Error:' line\n{result.stderr[-2000:]}"
    assert expected in errors[0], f"{where}: {errors[0]!r} does not name {expected!r}"


# --- producing and the model -------------------------------------------------------------------


class Producing(threading.Thread):
    """Keeps appending upserts and tombstones to *topic* until stopped (daemon thread)."""

    def __init__(
        self,
        kafka: KafkaTool,
        topic: str,
        partitions: int,
        keys: int = 2000,
        pause: float = 0.02,
        seed: int = 7,
    ) -> None:
        super().__init__(daemon=True)
        self.kafka, self.topic, self.partitions, self.keys, self.pause = kafka, topic, partitions, keys, pause
        self.stop = threading.Event()
        self.produced: list[Rec] = []
        self.error: BaseException | None = None
        self.rng = random.Random(seed)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                batch: list[tuple[int, bytes | None, bytes | None]] = []
                for _ in range(100):
                    k = self.rng.randrange(self.keys)
                    value = None if self.rng.random() < 0.1 else self.rng.randbytes(16) * 16
                    batch.append((k % self.partitions, b"k%05d" % k, value))
                self.produced += self.kafka.produce(self.topic, batch)
                time.sleep(self.pause)
        except BaseException as e:  # surfaced by the test
            self.error = e

    def finish(self) -> list[Rec]:
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "producer did not stop"
        if self.error is not None:
            raise AssertionError(f"producer failed: {self.error!r}")
        return self.produced


def truth_at(records: Iterable[Rec], offsets: Mapping[int, int] | None = None) -> dict[bytes, bytes]:
    """The table holding exactly the records below *offsets* (all records without)."""
    kept = [r for r in records if offsets is None or r.offset < offsets.get(r.partition, 0)]
    return KafkaTool.truth(kept)


@dataclass
class Restored:
    table: dict[bytes, bytes]
    offsets: dict[int, int]
    checkpoint: int | None
    skipped: list[int] = field(default_factory=list)


def restore(
    bootstrap: str,
    topic: str,
    loc: Location | None,
    *,
    name: str | None = None,
    read_only: bool = False,
    generation: int | None = None,
    tail: bool = True,
) -> Restored:
    """An in-process restore (statesnap's restore path; the *result* is judged by the caller): a
    writer's ``Table``, or with *read_only* (or ``tail=False``) a ``Follower``."""
    from statesnap import Follower, Table

    options = (
        CheckpointOptions(loc.url, storage_options=dict(loc.options), generation=generation)
        if loc is not None
        else None
    )
    t: Table[bytes, bytes] | Follower[bytes, bytes]
    if read_only or not tail:
        t = Follower(
            topic, name=name, bootstrap_servers=bootstrap, checkpoints=options, timeout=20.0, tail=tail
        )
    else:
        t = Table(
            topic, name=name, bootstrap_servers=bootstrap, checkpoints=options, background=False, timeout=20.0
        )
    try:
        report = t.start()
        return Restored(
            dict(t.raw_items()),
            dict(t.offsets),
            report.checkpoint,
            [s.generation for s in report.skipped],
        )
    finally:
        if isinstance(t, Table):
            t.close(checkpoint=False)
        else:
            t.close()


def judge(ledger: CaseLedger, what: str, got: Mapping[bytes, bytes], expected: Mapping[bytes, bytes]) -> None:
    """Record and fail on a wrong table: rows missing (data lost) or rows different/extra."""
    if dict(got) == dict(expected):
        return
    missing = [k for k in expected if k not in got]
    wrong = [k for k in got if expected.get(k) != got[k]]
    detail = f"{what}: {len(missing)} keys missing, {len(wrong)} wrong/extra (of {len(expected)})"
    ledger.fail("data_lost" if missing and not wrong else "wrong_tables", detail)


def table_digest_of(table: Mapping[bytes, bytes]) -> str:
    """The README's digest, computed here from the definition (not by statesnap): SHA-256 over
    (key, value) pairs in ascending key order, each as len:u32be key len:u32be value."""
    h = hashlib.sha256()
    for key in sorted(table):
        value = table[key]
        h.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return h.hexdigest()


def referenced_files(repo: CheckpointRepository) -> tuple[set[int], set[str]]:
    """(generations with a readable manifest, data paths they reference)."""
    gens: set[int] = set()
    files: set[str] = set()
    for gen, m in repo.manifests():
        if isinstance(m, CheckpointManifest):
            gens.add(gen)
            files |= {f.path for f in m.files}
    return gens, files


def debris(loc: Location) -> list[str]:
    """Everything in the store that no retained checkpoint needs: unreferenced data files,
    temp files, records of deleted generations, unfinished multipart uploads."""
    repo = repo_of(loc)
    gens, files = referenced_files(repo)
    extra: list[str] = []
    for table_dir, keys in loc.table_keys().items():
        assert table_dir == repo.directory, (table_dir, repo.directory)
        for key in keys:
            if key in (layout.DESCRIPTOR, layout.HIGH_WATER):
                continue
            gen = layout.manifest_generation(key)
            if gen is not None and gen in gens:
                continue
            if key.startswith("data/") and key in files:
                continue
            rec = layout.record_generation(key)
            if rec is not None and rec in gens:
                continue
            extra.append(key)
    extra += [f"(upload) {u}" for u in loc.uploads()]
    return sorted(extra)


def checkpoint_contents(loc: Location, generation: int) -> tuple[dict[int, int], dict[bytes, bytes]]:
    """(next offsets, table) of one checkpoint, read without statesnap: the manifest JSON and its
    Parquet files straight from the store, bases then deltas in order, a null value deleting."""
    import io

    import pyarrow.parquet as pq

    def read(rel: str) -> bytes:
        if loc.kind == "file":
            assert loc.root is not None
            return (loc.root / rel).read_bytes()
        key = f"{loc.prefix}/{rel}" if loc.prefix else rel
        return bytes(loc.s3.get_object(Bucket=loc.bucket, Key=key)["Body"].read())

    (directory,) = {k.split("/", 1)[0] for k in loc.list_keys()}
    manifest = json.loads(read(f"{directory}/snapshots/{generation:020d}.json"))
    offsets: dict[int, int] = {}
    table: dict[bytes, bytes] = {}
    for partition, entry in manifest["partitions"].items():
        offsets[int(partition)] = int(entry["next_offset"])
        for f in entry["files"]:
            rows = pq.read_table(io.BytesIO(read(f"{directory}/{f['path']}"))).to_pydict()
            for key, value in zip(rows["key"], rows["value"], strict=True):
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
    return offsets, table
