"""Blob store on S3 or any S3-compatible endpoint: ``s3://bucket/prefix``.

Endpoint, region and credentials come from the standard AWS settings (``AWS_ENDPOINT_URL``,
``AWS_REGION``, profiles, instance roles) unless given as options. Write-once objects use a
conditional put (``If-None-Match: *``), so two writers cannot both commit one manifest.
"""

from __future__ import annotations

import builtins
import math
import os
import re
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from statesnap.blob.base import BlobInfo, BlobStore, key_parts
from statesnap.errors import (
    BlobExistsError,
    BlobNotFoundError,
    BlobStoreError,
    InvalidStoreUrlError,
    MissingBucketError,
    StoreNotWritableError,
)
from statesnap.redaction import (
    MASK,
    redact_url,
    register_secrets,
    register_url_secrets,
    scrub,
    unparsable,
    userinfo_of,
)

__all__ = ["READ_PART", "READ_THREADS", "S3_OPTIONS", "S3BlobStore"]

#: Options the store understands; everything else is a typo and is rejected up front.
S3_OPTIONS = frozenset(
    {
        "endpoint_url",
        "region",
        "profile",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "connect_timeout",
        "read_timeout",
        "max_attempts",
        "sse",
        "sse_kms_key_id",
        "addressing_style",
    }
)
_SECRET_OPTIONS = frozenset({"aws_secret_access_key", "aws_session_token", "aws_access_key_id"})
_DELETE_BATCH = 1000  # S3 DeleteObjects accepts at most 1000 keys per request
#: Objects larger than one part are read with parallel ranged GETs of this size: one stream of
#: one connection is far below a network's (or S3's) bandwidth; 8 MiB is AWS's recommended size.
READ_PART = 8 * 1024 * 1024
#: Part downloads in flight across all reads of the process (boto3 clients are thread-safe).
READ_THREADS = 8
_READ_ATTEMPTS = 3
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


_OPTION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: botocore's own rule for region names; anything else it refuses, echoing the value.
_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])?")
_ADDRESSING = ("auto", "virtual", "path")


def _check_options(options: dict[str, str]) -> None:
    """Parse every option botocore would parse, before it does: botocore (and ``float()``) echo a
    value they cannot parse, and a value in the wrong place may be a pasted secret. Errors name
    the option, never its value (:func:`~statesnap.redaction.unparsable`)."""
    for name in ("connect_timeout", "read_timeout"):
        if name in options:
            try:
                seconds = float(options[name])
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and seconds > 0):
                raise InvalidStoreUrlError(
                    unparsable(f"S3 option {name}", options[name], "must be seconds > 0")
                )
    if "max_attempts" in options:
        text = options["max_attempts"].strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 3 and 1 <= int(text) <= 100):
            raise InvalidStoreUrlError(
                unparsable("S3 option max_attempts", options["max_attempts"], "must be a whole number 1-100")
            )
    if "region" in options and not _REGION.fullmatch(options["region"]):
        raise InvalidStoreUrlError(unparsable("S3 option region", options["region"], "is not a region name"))
    if "addressing_style" in options and options["addressing_style"] not in _ADDRESSING:
        raise InvalidStoreUrlError(
            unparsable(
                "S3 option addressing_style", options["addressing_style"], f"must be one of {_ADDRESSING}"
            )
        )
    if "endpoint_url" in options:
        _check_endpoint(options["endpoint_url"])


def _check_endpoint(url: str) -> None:
    """``http(s)://host[:port][/path]`` without userinfo: S3 signs requests with the credentials
    (SigV4), never with a URL's ``user:password@``, and the endpoint is echoed by every connection
    error, so a URL carrying them is refused, not shown."""
    if userinfo_of(url):  # before parsing: a '/' in the password would end the host early
        register_url_secrets(url)
        raise InvalidStoreUrlError(
            "S3 option endpoint_url carries credentials (user:password@, not shown): S3 does not use "
            "them; give credentials through the AWS settings or the aws_access_key_id and "
            "aws_secret_access_key options"
        )
    try:
        parts = urlsplit(url)
        valid = parts.scheme.lower() in {"http", "https"} and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, an unbalanced '['
        valid = False
    if not valid or "@" in url:
        raise InvalidStoreUrlError(unparsable("S3 option endpoint_url", url, "must be http(s)://host[:port]"))


class _ObjectChangedError(Exception):
    """The object was replaced between the parts of one read."""


def _range_pool() -> ThreadPoolExecutor:
    global _pool  # noqa: PLW0603 - one lazily created pool per process
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="statesnap-s3-read")
        return _pool


def _content_length(content_range: str | None, fallback: int) -> int:
    """The object size from ``Content-Range: bytes 0-8388607/123456789``."""
    if content_range and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return fallback


class S3BlobStore:
    """Objects under ``s3://bucket/prefix``; the boto3 client is created lazily per process."""

    def __init__(self, bucket: str, prefix: str = "", **options: str) -> None:
        unknown = set(options) - S3_OPTIONS
        if unknown:
            shown = sorted(n if _OPTION_NAME.fullmatch(n) else "(a name not shown)" for n in unknown)
            raise BlobStoreError(f"unknown S3 option(s) {shown}; known: {sorted(S3_OPTIONS)}")
        if not bucket:
            raise BlobStoreError("S3 URL has no bucket: use s3://bucket/prefix")
        register_secrets(options)
        _check_options(options)
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._options = dict(options)
        self._client: Any = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._bucket, self._prefix, self._options))

    def for_executors(self) -> S3BlobStore:
        """This store with what the driver resolved from its environment written into its options
        (endpoint, region, credentials), so it works where it is unpickled — Spark executors do
        not share the driver's environment. Options given explicitly win; nothing is added when
        the driver has nothing either."""
        import boto3

        options = dict(self._options)
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in options:
            options["endpoint_url"] = endpoint
        session = boto3.session.Session(profile_name=options.pop("profile", None))
        if session.region_name and "region" not in options:
            options["region"] = session.region_name
        credentials = session.get_credentials()
        if credentials is not None and "aws_access_key_id" not in options:
            frozen = credentials.get_frozen_credentials()
            options["aws_access_key_id"] = frozen.access_key
            options["aws_secret_access_key"] = frozen.secret_key
            if frozen.token:
                options["aws_session_token"] = frozen.token
        elif "profile" in self._options:
            options["profile"] = self._options["profile"]
        return S3BlobStore(self._bucket, self._prefix, **options)

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"

    @property
    def url(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}".rstrip("/")

    @property
    def shown(self) -> str:
        return self.url

    @property
    def options(self) -> dict[str, str]:
        """The store's options, secrets included: only for handing to processes that must open
        the same store (Spark executors, as an option Spark redacts); never log them."""
        return dict(self._options)

    @property
    def safe_options(self) -> dict[str, str]:
        """Options with secrets masked, for logs and ``--json`` output."""
        return {k: (MASK if k in _SECRET_OPTIONS else redact_url(v)) for k, v in self._options.items()}

    def _key(self, key: str, *, prefix: bool = False) -> str:
        # Refuses "..", absolute and non-canonical keys, exactly like the file store.
        key = "/".join(key_parts(key, url=self.url, prefix=prefix))
        return f"{self._prefix}/{key}" if self._prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self._prefix) + 1 :] if self._prefix else full

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                session = boto3.session.Session(profile_name=self._options.get("profile"))
                # Every wait has a deadline: a silent endpoint fails a request in about
                # connect/read timeout x attempts (botocore's defaults are 60 s x 5).
                config = Config(
                    retries={"max_attempts": int(self._options.get("max_attempts", 3)), "mode": "standard"},
                    connect_timeout=float(self._options.get("connect_timeout", 5)),
                    read_timeout=float(self._options.get("read_timeout", 20)),
                    s3={"addressing_style": self._options.get("addressing_style", "auto")},
                    max_pool_connections=32,
                )
                self._client = session.client(
                    "s3",
                    endpoint_url=self._options.get("endpoint_url"),
                    region_name=self._options.get("region"),
                    aws_access_key_id=self._options.get("aws_access_key_id"),
                    aws_secret_access_key=self._options.get("aws_secret_access_key"),
                    aws_session_token=self._options.get("aws_session_token"),
                    config=config,
                )
            return self._client

    def _missing_bucket(self) -> MissingBucketError:
        # statesnap creates prefixes, never buckets: a bucket carries policy (region, encryption,
        # lifecycle, access) that is the operator's to choose.
        return MissingBucketError(
            f"bucket {self._bucket!r} does not exist ({self.url}); statesnap never creates buckets: "
            "create it (with the region, encryption and access you want) or fix the URL"
        )

    def _translate(self, e: Exception, what: str) -> BlobStoreError:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(e, ClientError):
            code = str(e.response.get("Error", {}).get("Code", ""))
            if code in {"NoSuchBucket"}:
                return self._missing_bucket()
            if code in {"NoSuchKey", "404", "NotFound"}:
                return BlobNotFoundError(f"{self.url}/{what} does not exist")
            if code in {"PreconditionFailed", "412", "ConditionalRequestConflict"}:
                return BlobExistsError(f"{self.url}/{what} already exists")
            if code in {"AccessDenied", "403", "AllAccessDisabled"}:
                return StoreNotWritableError(f"access denied to {self.url}/{what}")
            return BlobStoreError(f"S3 error {code} on {self.url}/{what}")
        # botocore's messages quote the endpoint URL and sometimes a value it refused.
        if isinstance(e, BotoCoreError):
            return BlobStoreError(f"cannot reach S3 for {self.url}: {scrub(str(e))}")
        return BlobStoreError(f"S3 failure on {self.url}/{what}: {scrub(str(e))}")

    def read(self, key: str) -> bytes:
        """The whole object; one GET when it fits in a part, else parallel ranged GETs.

        The first request asks for the first part and learns the size from ``Content-Range``;
        the other parts are fetched concurrently with ``If-Match`` on the first part's ETag, so
        an object replaced mid-read is read again rather than stitched from two versions.
        """
        self._key(key)  # InvalidBlobKeyError before any request
        for _attempt in range(_READ_ATTEMPTS):
            try:
                return self._read_parts(key)
            except _ObjectChangedError:
                continue
            except Exception as e:
                raise self._translate(e, key) from e
        raise BlobStoreError(f"{self.url}/{key} kept changing while being read")

    def _read_parts(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        full = self._key(key)
        try:
            first = self.client.get_object(Bucket=self._bucket, Key=full, Range=f"bytes=0-{READ_PART - 1}")
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code", "")) != "InvalidRange":
                raise
            # An empty object has no byte 0: S3 answers 416, a plain GET answers the empty body.
            return bytes(self.client.get_object(Bucket=self._bucket, Key=full)["Body"].read())
        head = bytes(first["Body"].read())
        total = _content_length(first.get("ContentRange"), len(head))
        if total <= len(head):
            return head
        etag = first["ETag"]
        ranges = [(lo, min(lo + READ_PART, total) - 1) for lo in range(len(head), total, READ_PART)]

        def part(span: tuple[int, int]) -> bytes:
            try:
                resp = self.client.get_object(
                    Bucket=self._bucket, Key=full, Range=f"bytes={span[0]}-{span[1]}", IfMatch=etag
                )
            except ClientError as e:
                if str(e.response.get("Error", {}).get("Code", "")) in {"PreconditionFailed", "412"}:
                    raise _ObjectChangedError from e
                raise
            data = bytes(resp["Body"].read())
            if len(data) != span[1] - span[0] + 1:
                raise _ObjectChangedError
            return data

        return b"".join([head, *_range_pool().map(part, ranges)])

    def write(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        extra: dict[str, Any] = {}
        if "sse" in self._options:
            extra["ServerSideEncryption"] = self._options["sse"]
        if "sse_kms_key_id" in self._options:
            extra["SSEKMSKeyId"] = self._options["sse_kms_key_id"]
        if if_absent:
            extra["IfNoneMatch"] = "*"
        full = self._key(key)  # InvalidBlobKeyError before any request
        try:
            self.client.put_object(Bucket=self._bucket, Key=full, Body=data, **extra)
        except Exception as e:
            raise self._translate(e, key) from e

    def copy_from(self, source: BlobStore, source_key: str, key: str) -> str | None:
        """S3's server-side copy (``CopyObject``; multipart copy past 5 GiB through boto3's
        managed ``copy``), the bytes never leaving the service; None (read + write instead) for a
        source on another endpoint or with other credentials, which this client may not read."""
        if not isinstance(source, S3BlobStore) or not self._same_service(source):
            return None
        extra: dict[str, Any] = {}
        if "sse" in self._options:
            extra["ServerSideEncryption"] = self._options["sse"]
        if "sse_kms_key_id" in self._options:
            extra["SSEKMSKeyId"] = self._options["sse_kms_key_id"]
        origin = {"Bucket": source._bucket, "Key": source._key(source_key)}
        full = self._key(key)  # InvalidBlobKeyError before any request
        try:
            self.client.copy(origin, self._bucket, full, ExtraArgs=extra or None)
        except Exception as e:
            raise self._translate(e, key) from e
        return "server"

    def _same_service(self, other: S3BlobStore) -> bool:
        """Same endpoint, profile and credentials: one client can read the other's objects."""
        keys = ("endpoint_url", "profile", "aws_access_key_id", "aws_secret_access_key", "aws_session_token")
        return all(self._options.get(k) == other._options.get(k) for k in keys)

    def exists(self, key: str) -> bool:
        full = self._key(key)  # InvalidBlobKeyError before any request
        try:
            self.client.head_object(Bucket=self._bucket, Key=full)
        except Exception as e:
            err = self._translate(e, key)
            if isinstance(err, BlobNotFoundError):
                # HEAD answers a bare 404 for a missing bucket too; a missing bucket is an error.
                self.check(writable=False)
                return False
            raise err from e
        return True

    def list(self, prefix: str = "") -> builtins.list[BlobInfo]:
        # Directory semantics, like the filesystem store: "tbl" lists "tbl/…", never "tbl2/…".
        stem = prefix.strip("/")
        full = f"{self._key(stem, prefix=True)}/" if stem else (f"{self._prefix}/" if self._prefix else "")
        out: list[BlobInfo] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full):
                for obj in page.get("Contents", []):
                    out.append(BlobInfo(self._rel(obj["Key"]), obj["Size"], obj["LastModified"]))
            if stem and not prefix.endswith("/"):
                exact_key = self._key(stem, prefix=True)
                exact = self.client.list_objects_v2(Bucket=self._bucket, Prefix=exact_key, MaxKeys=1)
                for obj in exact.get("Contents", []):
                    if obj["Key"] == exact_key:
                        out.append(BlobInfo(self._rel(obj["Key"]), obj["Size"], obj["LastModified"]))
        except Exception as e:
            raise self._translate(e, prefix) from e
        out.sort(key=lambda b: b.key)
        return out

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        full = self._key(prefix, prefix=True) if prefix.strip("/") else self._prefix
        full = f"{full}/" if full else ""
        names: list[str] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full, Delimiter="/"):
                for cp in page.get("CommonPrefixes", []):
                    names.append(cp["Prefix"][len(full) :].strip("/"))
        except Exception as e:
            raise self._translate(e, prefix) from e
        return sorted(names)

    def delete(self, keys: Iterable[str]) -> None:
        batch = [self._key(k) for k in keys]
        try:
            for i in range(0, len(batch), _DELETE_BATCH):
                chunk = batch[i : i + _DELETE_BATCH]
                self.client.delete_objects(
                    Bucket=self._bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
        except Exception as e:
            raise self._translate(e, "(delete)") from e

    def check(self, *, writable: bool) -> None:
        try:
            self.client.head_bucket(Bucket=self._bucket)
        except Exception as e:
            err = self._translate(e, "")
            if isinstance(err, BlobNotFoundError):
                err = self._missing_bucket()
            raise err from e

    def abort_stale_uploads(self, prefix: str, older_than: datetime, *, dry_run: bool = False) -> int:
        stem = prefix.strip("/")
        full = f"{self._key(stem, prefix=True)}/" if stem else (f"{self._prefix}/" if self._prefix else "")
        aborted = 0
        try:
            paginator = self.client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=full):
                for upload in page.get("Uploads", []):
                    if upload["Initiated"] >= older_than:
                        continue
                    if not dry_run:
                        self.client.abort_multipart_upload(
                            Bucket=self._bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                    aborted += 1
        except Exception as e:
            raise self._translate(e, prefix) from e
        return aborted


def _rebuild(bucket: str, prefix: str, options: dict[str, str]) -> S3BlobStore:
    return S3BlobStore(bucket, prefix, **options)
