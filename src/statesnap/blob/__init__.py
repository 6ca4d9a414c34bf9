"""Blob stores chosen by URL scheme: ``file://`` (or a bare path) and ``s3://``.

``open_blob_store`` is the only constructor callers need; it does no I/O, so a malformed URL
fails at once and an unreachable store fails on first use (or on :meth:`BlobStore.check`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from statesnap.blob.base import BlobInfo, BlobStore, CopyingBlobStore, key_parts
from statesnap.blob.file import FileBlobStore
from statesnap.errors import InvalidStoreUrlError, UnknownSchemeError
from statesnap.redaction import (
    install_record_redaction,
    redact_url,
    register_secrets,
    register_url_secrets,
)

__all__ = [
    "BlobInfo",
    "BlobStore",
    "CopyingBlobStore",
    "FileBlobStore",
    "copy_blob",
    "key_parts",
    "open_blob_store",
]

# botocore logs request headers (x-amz-security-token, Authorization) at DEBUG: scrub them.
install_record_redaction()


def open_blob_store(url: str, **storage_options: Any) -> BlobStore:
    """Open the blob store a URL names.

    ``file:///path`` or a bare path: a local directory. ``s3://bucket/prefix``: S3 or any
    S3-compatible store; options (``endpoint_url``, ``region``, ``profile``, ``sse``, …) come from
    URL query parameters or *storage_options*, the keyword arguments winning.

    Errors show the URL with credentials masked (:func:`~statesnap.redaction.redact_url`).
    An ``s3://`` URL carrying credentials (``s3://KEY:SECRET@bucket``) is refused, see
    :func:`_refuse_credentials_in`.
    """
    if not isinstance(url, str) or not url.strip():
        raise UnknownSchemeError("checkpoint URL is empty")
    register_secrets({k: v for k, v in storage_options.items() if isinstance(v, str)})
    register_url_secrets(url)
    for value in storage_options.values():
        if isinstance(value, str):
            register_url_secrets(value)  # endpoint_url=http://user:pass@host
    if "\x00" in url:
        raise InvalidStoreUrlError(
            f"checkpoint URL {redact_url(url.replace(chr(0), '%00'))!r} has a NUL byte"
        )
    try:
        parts = urlsplit(url)
    except ValueError as e:  # e.g. an unbalanced '[' in the host
        raise InvalidStoreUrlError(f"malformed checkpoint URL {redact_url(url)!r}: {e}") from None
    register_secrets(parse_qsl(parts.query))
    scheme = parts.scheme.lower()
    if not scheme and "://" in url:
        raise UnknownSchemeError(
            f"checkpoint URL {redact_url(url)!r} has no scheme before '://'; "
            "use file:///path, a path, or s3://bucket/prefix"
        )
    if scheme in {"", "file"} or (len(scheme) == 1 and url[1:3] == ":\\"):
        if scheme == "file" and parts.netloc not in {"", "localhost"}:
            raise UnknownSchemeError(f"file URL with a host is not supported: {redact_url(url)!r}")
        if scheme == "file" and parts.query:
            raise InvalidStoreUrlError(
                f"file URL takes no options: {redact_url(url)!r} (options are for s3:// stores)"
            )
        path = unquote(parts.path) if scheme == "file" else url
        if "\x00" in path:
            raise InvalidStoreUrlError(f"checkpoint URL {redact_url(url)!r} has a NUL byte (%00)")
        return FileBlobStore(path, shown=url)
    if scheme in {"s3", "s3a"}:
        from statesnap.blob.s3 import S3BlobStore

        _refuse_credentials_in(parts.netloc, scheme)
        options = dict(parse_qsl(parts.query))
        options.update({k: str(v) for k, v in storage_options.items() if v is not None})
        return S3BlobStore(parts.netloc, unquote(parts.path), **options)
    raise UnknownSchemeError(
        f"unknown checkpoint URL scheme {scheme!r} in {redact_url(url)!r}; "
        "use file:///path, a path, or s3://bucket/prefix"
    )


def copy_blob(source: BlobStore, source_key: str, target: BlobStore, key: str) -> str:
    """Copy one object between (or within) stores; returns how: ``"link"`` (a hard link on one
    filesystem), ``"server"`` (S3 ``CopyObject``, the bytes never leave the service), ``"copy"``
    (a file copy) or ``"bytes"`` (read here, written there: stores that cannot copy between each
    other). The target is a separate object either way: deleting one side never touches the other.
    """
    if isinstance(target, CopyingBlobStore):
        how = target.copy_from(source, source_key, key)
        if how is not None:
            return how
    target.write(key, source.read(source_key))
    return "bytes"


def _refuse_credentials_in(netloc: str, scheme: str) -> None:
    """Refuse ``s3://KEY:SECRET@bucket`` before anything echoes it: deliberately not accepted.

    statesnap takes S3 credentials from the AWS settings (environment, profiles, instance roles) or
    the ``aws_access_key_id`` / ``aws_secret_access_key`` options, never from the URL: a URL is
    shown in logs, errors, manifests and ``--json`` output, and S3 itself has no userinfo (botocore
    took ``KEY:SECRET@bucket`` for a bucket name and printed it twice). Bucket names hold neither
    ``@`` nor ``:``, so either one means credentials; a secret containing ``/`` ends the "host"
    early (``s3://KEY:abc/def@bucket``), which the ``:`` still catches. The message shows no part
    of the URL.
    """
    if "@" in netloc or ":" in netloc:
        raise InvalidStoreUrlError(
            f"{scheme}:// URL carries credentials or a port before the bucket (not shown): use "
            f"{scheme}://bucket/prefix and give credentials through the AWS settings (AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, roles) or the aws_access_key_id and "
            "aws_secret_access_key options, and an endpoint as endpoint_url"
        )
