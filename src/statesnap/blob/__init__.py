"""Blob stores chosen by URL scheme: ``file://`` (or a bare path) and ``s3://``.

``open_blob_store`` is the only constructor callers need; it does no I/O, so a malformed URL
fails at once and an unreachable store fails on first use (or on :meth:`BlobStore.check`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from statesnap.blob.base import BlobInfo, BlobStore
from statesnap.blob.file import FileBlobStore
from statesnap.errors import UnknownSchemeError

__all__ = ["BlobInfo", "BlobStore", "FileBlobStore", "open_blob_store"]


def open_blob_store(url: str, **storage_options: Any) -> BlobStore:
    """Open the blob store a URL names.

    ``file:///path`` or a bare path: a local directory. ``s3://bucket/prefix``: S3 or any
    S3-compatible store; options (``endpoint_url``, ``region``, ``profile``, ``sse``, …) come from
    URL query parameters or *storage_options*, the keyword arguments winning.
    """
    if not isinstance(url, str) or not url.strip():
        raise UnknownSchemeError("checkpoint URL is empty")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in {"", "file"} or (len(scheme) == 1 and url[1:3] == ":\\"):
        path = unquote(parts.path) if scheme == "file" else url
        if scheme == "file" and parts.netloc not in {"", "localhost"}:
            raise UnknownSchemeError(f"file URL with a host is not supported: {url!r}")
        return FileBlobStore(path)
    if scheme in {"s3", "s3a"}:
        from statesnap.blob.s3 import S3BlobStore

        options = dict(parse_qsl(parts.query))
        options.update({k: str(v) for k, v in storage_options.items() if v is not None})
        return S3BlobStore(parts.netloc, unquote(parts.path), **options)
    raise UnknownSchemeError(
        f"unknown checkpoint URL scheme {scheme!r} in {url!r}; use file:///path, a path, or s3://bucket/prefix"
    )
