"""Checkpoint URLs, blob keys and secret redaction: typed one-line errors that never leak a secret.

Every case here was reproduced in issue 11: a URL echoed with its ``aws_secret_access_key``,
``file:///…%00…`` escaping as ``ValueError: embedded null byte``, ``://nothing`` taken as a relative
path, ``--checkpoints /proc/ckpt`` escaping as a 54-line ``FileNotFoundError``.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from statesnap.blob import FileBlobStore, key_parts, open_blob_store
from statesnap.errors import (
    BlobStoreError,
    ConfigError,
    InvalidBlobKeyError,
    InvalidStoreUrlError,
    MissingBucketError,
    StatesnapError,
    StoreNotWritableError,
    UnknownSchemeError,
)
from statesnap.redaction import (
    SecretFilter,
    install_log_redaction,
    redact_url,
    register_secret,
    scrub,
)

SECRET = "wJalrXUtnFEMI-K7MDENG-SECRET"
TOKEN = "FwoGZXIvYXdzEJr-SESSION-TOKEN"


# --- URLs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"gs://bucket/x?aws_secret_access_key={SECRET}&region=eu-west-1",
        f"file://otherhost/data?aws_secret_access_key={SECRET}",
        f"ftp://user:{SECRET}@host/x",
        f"hdfs:///x?aws_session_token={SECRET}",
        f"file:///tmp/ckpt?aws_secret_access_key={SECRET}",
        f"s3://[broken/x?aws_secret_access_key={SECRET}",
    ],
)
def test_url_errors_never_echo_secrets(url: str) -> None:
    with pytest.raises(BlobStoreError) as info:
        open_blob_store(url)
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert SECRET not in message
    assert "***" in message  # the URL is still shown, masked
    assert "\n" not in message


def test_unknown_scheme_still_names_scheme_and_safe_parts() -> None:
    with pytest.raises(UnknownSchemeError) as info:
        open_blob_store(f"gs://bucket/prefix?aws_secret_access_key={SECRET}&region=eu-west-1")
    message = str(info.value)
    assert "'gs'" in message
    assert "gs://bucket/prefix" in message
    assert "region=eu-west-1" in message


@pytest.mark.parametrize("url", ["://nothing", "://", ":///abs"])
def test_an_empty_scheme_is_not_a_relative_path(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnknownSchemeError, match="no scheme"):
        open_blob_store(url)
    assert list(tmp_path.iterdir()) == []  # nothing created in the working directory


@pytest.mark.parametrize("url", ["file:///tmp/a%00b", "file:///tmp/%00", "/tmp/a\x00b", "file:///tmp/a\x00b"])
def test_a_nul_byte_is_a_typed_error(url: str) -> None:
    with pytest.raises(InvalidStoreUrlError, match="NUL") as info:
        open_blob_store(url)
    assert isinstance(info.value, StatesnapError)
    with pytest.raises(InvalidStoreUrlError):
        FileBlobStore("/tmp/a\x00b")


def test_a_root_that_cannot_hold_directories_is_not_writable() -> None:
    """/proc refuses mkdir with ENOENT, which escaped as a raw FileNotFoundError."""
    store = open_blob_store("/proc/statesnap-ckpt")
    with pytest.raises(StoreNotWritableError, match="/proc/statesnap-ckpt") as info:
        store.write("t/table.json", b"{}")
    assert not isinstance(info.value, FileNotFoundError)  # not mistaken for "missing object"
    assert store.list("") == []  # readers see an empty store, no traceback


def test_bare_paths_with_percent_signs_stay_literal(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "a%00b"))
    assert isinstance(store, FileBlobStore)
    store.write("k", b"1")
    assert (tmp_path / "a%00b" / "k").read_bytes() == b"1"


def test_redact_url() -> None:
    assert redact_url("s3://b/p?region=eu&aws_secret_access_key=abc") == (
        "s3://b/p?region=eu&aws_secret_access_key=***"
    )
    assert redact_url("https://alice:pw@host:8080/x") == "https://***@host:8080/x"  # the user too
    assert redact_url("https://token@host/x") == "https://***@host/x"
    assert redact_url("/plain/path") == "/plain/path"
    assert redact_url(f"s3://b/p?X-Amz-Signature=sig&X-Amz-Credential={SECRET}") == (
        "s3://b/p?X-Amz-Signature=***&X-Amz-Credential=***"
    )


# --- credentials in s3:// URLs and unparsable S3 options (issue 22) ------------------------------

KEY_ID = "AKIABLOBURLS7Q9ZPL"


@pytest.mark.parametrize(
    "url",
    [
        f"s3://{KEY_ID}:{SECRET}@bucket/p",
        f"s3://{KEY_ID}@bucket/p",
        f"s3a://{KEY_ID}:{SECRET}@bucket/p",
        f"s3://{KEY_ID}:abc/{SECRET}@bucket/p",  # '/' in the secret ends urlsplit's host early
        f"s3://{KEY_ID}:p%40ss{SECRET}@bucket/p",
        f"s3://{KEY_ID}:p@ss@{SECRET}@bucket/p",
        f"s3://{KEY_ID}:{SECRET}@bucket/p?region=eu-west-1",
    ],
)
def test_s3_urls_with_credentials_are_refused_without_echoing_them(url: str) -> None:
    """``checkpoints verify 's3://KEY:SECRET@bucket/p'`` printed key and secret twice (botocore
    took ``KEY:SECRET@bucket`` for a bucket name). Refused before any I/O, the URL not shown."""
    with pytest.raises(InvalidStoreUrlError) as info:
        open_blob_store(url)
    message = str(info.value)
    for piece in (KEY_ID, SECRET, "p@ss"):
        assert piece not in message
    assert "aws_secret_access_key" in message  # says where credentials go
    assert "\n" not in message


BAD_OPTIONS = [
    ("connect_timeout", SECRET),
    ("connect_timeout", "-1"),
    ("read_timeout", "nan"),
    ("read_timeout", "inf"),
    ("max_attempts", SECRET),
    ("max_attempts", "0"),
    ("max_attempts", "9" * 5000),
    ("region", f"eu west {SECRET}"),
    ("addressing_style", SECRET),
    ("endpoint_url", SECRET),
    ("endpoint_url", f"ftp://{SECRET}"),
    ("endpoint_url", "http://[::1"),
    ("endpoint_url", f"http://u:{SECRET}@127.0.0.1:9000"),
    ("endpoint_url", f"https://{SECRET}@s3.example.invalid"),
    ("endpoint_url", f"http://u:abc/{SECRET}@127.0.0.1:9000"),  # '/' in the password
    ("endpoint_url", "http://127.0.0.1:99999"),
]


@pytest.mark.parametrize(("name", "value"), BAD_OPTIONS)
def test_unparsable_s3_options_are_typed_errors_that_never_show_the_value(name: str, value: str) -> None:
    """``?connect_timeout=<pasted secret>`` escaped as "could not convert string to float:
    '<secret>'", and ``endpoint_url=<secret>`` as botocore's "Invalid endpoint: <secret>"."""
    for url, options in (
        (f"s3://bucket/p?{name}={quote(value, safe='')}", {}),
        ("s3://bucket/p", {name: value}),
    ):
        with pytest.raises(InvalidStoreUrlError) as info:
            open_blob_store(url, **options)
        message = str(info.value)
        assert name in message
        assert SECRET not in message
        assert "9" * 50 not in message
        assert "not shown" in message
    assert SECRET not in scrub(f"botocore: Invalid endpoint: {SECRET}")  # and masked in logs after


@pytest.mark.parametrize(
    "options",
    [
        {"connect_timeout": "2.5", "read_timeout": "30", "max_attempts": "5"},
        {"region": "eu-west-1", "addressing_style": "path"},
        {"endpoint_url": "http://127.0.0.1:9000"},
        {"endpoint_url": "https://s3.example.invalid/base"},
    ],
)
def test_good_s3_options_are_accepted(options: dict[str, str]) -> None:
    store = open_blob_store("s3://bucket/p", **options)
    assert store.url == "s3://bucket/p"


def test_a_missing_bucket_says_statesnap_never_creates_buckets(s3_server: Any) -> None:
    """Proven on the moto S3 server: HEAD of a missing bucket answers 404."""
    import uuid

    store = open_blob_store(f"s3://no-such-{uuid.uuid4().hex[:10]}/p", **s3_server.storage_options())
    with pytest.raises(MissingBucketError, match="statesnap never creates buckets") as info:
        store.check(writable=False)
    assert "\n" not in str(info.value)


# --- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["../escape", "a/../../escape", "./x", "/etc/passwd", "a//b", "a/", "", "a\x00b", "a/\nb"],
)
def test_bad_keys_are_refused_by_the_file_store(key: str, tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "root")
    for op in (
        lambda: store.write(key, b"1"),
        lambda: store.read(key),
        lambda: store.exists(key),
        lambda: store.delete([key]),
    ):
        with pytest.raises(InvalidBlobKeyError) as info:
            op()
        assert isinstance(info.value, BlobStoreError)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "root").exists()  # nothing was written anywhere


def test_prefixes_may_be_empty_or_end_with_a_slash() -> None:
    assert key_parts("", url="x", prefix=True) == []
    assert key_parts("t/", url="x", prefix=True) == ["t"]
    assert key_parts("t/data/", url="x", prefix=True) == ["t", "data"]
    for bad in ("../", "/t", "t/../"):
        with pytest.raises(InvalidBlobKeyError):
            key_parts(bad, url="x", prefix=True)


def test_key_errors_do_not_leak_secrets_or_floods() -> None:
    register_secret(SECRET)
    with pytest.raises(InvalidBlobKeyError) as info:
        key_parts(f"../{SECRET}", url="s3://b/p")
    assert SECRET not in str(info.value)
    with pytest.raises(InvalidBlobKeyError) as info:
        key_parts("../" + "x" * 100_000, url="s3://b/p")
    assert len(str(info.value)) < 400


# --- the file store under concurrent deletes --------------------------------------------------


def test_list_survives_directories_removed_mid_walk(tmp_path: Path) -> None:
    """GC removes data/<generation>/ directories while a verifier lists: before the fix,
    ``rglob`` raised FileNotFoundError for a directory that vanished between scan and descent."""
    import shutil

    store = FileBlobStore(tmp_path)
    gens = 60
    for g in range(gens):
        for p in range(5):
            store.write(f"t/data/{g:05d}/p{p}.parquet", b"x")
    store.write("t/snapshots/keep.json", b"{}")
    stop = threading.Event()
    errors: list[BaseException] = []

    def gc() -> None:
        for g in range(gens):
            shutil.rmtree(tmp_path / "t" / "data" / f"{g:05d}", ignore_errors=True)
            if stop.is_set():
                return

    def lister() -> None:
        try:
            while not stop.is_set():
                keys = [b.key for b in store.list("t/")]
                assert "t/snapshots/keep.json" in keys
                store.list_dirs("t/data")
                store.abort_stale_uploads("t", datetime.now(UTC))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=lister) for _ in range(3)]
    for t in threads:
        t.start()
    gc_thread = threading.Thread(target=gc)
    gc_thread.start()
    gc_thread.join(30)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert [b.key for b in store.list("t/")] == ["t/snapshots/keep.json"]


def test_list_of_a_prefix_removed_before_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic version of the race: the directory disappears between stat and scandir."""
    import os
    import shutil

    store = FileBlobStore(tmp_path)
    store.write("t/data/1/p0", b"x")
    store.write("t/data/2/p0", b"x")
    real_scandir = os.scandir

    def scandir_after_gc(path: os.PathLike[str] | str) -> Iterator[os.DirEntry[str]]:
        if str(path).endswith("/data/1"):
            shutil.rmtree(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir_after_gc)
    assert [b.key for b in store.list("t/")] == ["t/data/2/p0"]


# --- log redaction ---------------------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """A handler on the root logger that records formatted output at DEBUG."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


BOTOCORE_LINE = (
    "Sending http request: <AWSPreparedRequest stream_output=False, method=PUT, "
    "url=http://127.0.0.1:1/b/k, headers={'x-amz-security-token': b'%s', "
    "'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20240501/us-east-1/s3/aws4_request, "
    "SignedHeaders=host, Signature=0123abcd'}>"
)


@pytest.mark.parametrize(
    "logger", ["botocore.endpoint", "statesnap.blob.s3", "urllib3.connectionpool", "s3transfer.x"]
)
def test_records_of_library_loggers_are_scrubbed_without_any_handler_filter(
    logger: str, captured: io.StringIO
) -> None:
    """The hook is installed on import of statesnap's blob and kafka layers, so even an
    application that configures its own handlers (no SecretFilter) never prints a secret."""
    named = logging.getLogger(logger)
    level = named.level
    named.setLevel(logging.DEBUG)  # another test (a CLI run in-process) may have raised it
    try:
        named.debug(BOTOCORE_LINE, TOKEN)
        named.warning("retrying with sasl.password=%s", SECRET)
    finally:
        named.setLevel(level)
    out = captured.getvalue()
    assert TOKEN not in out
    assert SECRET not in out
    assert "x-amz-security-token" in out  # the line itself is kept, only the values masked
    assert "'Authorization': b'***'" in out
    assert "sasl.password=***" in out


def test_exceptions_in_records_are_scrubbed(captured: io.StringIO) -> None:
    log = logging.getLogger("statesnap.test")
    try:
        raise RuntimeError(f"connect to https://u:{SECRET}@host failed")
    except RuntimeError:
        log.exception("boom")
    assert SECRET not in captured.getvalue()
    assert "RuntimeError" in captured.getvalue()


def test_install_log_redaction_filters_the_cli_handlers(captured: io.StringIO) -> None:
    """The CLI's handler also carries a SecretFilter, for records of any logger."""
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    try:
        install_log_redaction(handler)
        install_log_redaction(handler)  # idempotent
        assert sum(isinstance(f, SecretFilter) for f in handler.filters) == 1
        logging.getLogger("someapp").warning("token=%s", TOKEN)
        assert TOKEN not in stream.getvalue()
        assert "token=***" in stream.getvalue()
    finally:
        root.removeHandler(handler)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (
            f"sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="u" password="{SECRET}";',
            SECRET,
        ),
        (f"x-amz-security-token:{TOKEN}\nhost:127.0.0.1", TOKEN),
        (f'{{"aws_secret_access_key": "{SECRET}", "region": "eu"}}', SECRET),
        (f"ssl.key.password = {SECRET}", SECRET),
        (f"https://user:{SECRET}@example.com/path", SECRET),
    ],
)
def test_scrub_patterns(text: str, secret: str) -> None:
    assert secret not in scrub(text)


def test_scrub_keeps_ordinary_text_and_is_linear() -> None:
    import time

    plain = "restored orders: checkpoint=7 (100 keys), replayed 1000 records; region=eu-west-1"
    assert scrub(plain) == plain
    started = time.monotonic()
    scrub("tokentoken" * 50_000 + " " + "'x'" * 50_000 + " a=b" * 50_000)
    assert time.monotonic() - started < 2.0
