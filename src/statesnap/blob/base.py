"""The :class:`BlobStore` protocol: the only way statesnap touches files or object storage.

Keys are ``/``-separated paths relative to the store's root URL. Stores pickle by configuration
(URL + options), never by live clients, so they can travel to Spark executors.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from statesnap.errors import InvalidBlobKeyError
from statesnap.redaction import scrub

__all__ = ["BlobInfo", "BlobStore", "CopyingBlobStore", "key_parts"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Keys are shown in errors up to this length; a garbled manifest may hold a huge one.
_SHOWN = 120


def key_parts(key: str, *, url: str, prefix: bool = False) -> builtins.list[str]:
    """The ``/``-separated segments of *key*, refusing any key that could leave the store's root.

    Every store calls this before touching a key, so a manifest naming ``../../etc/passwd`` or
    ``/abs`` is an :class:`~statesnap.errors.InvalidBlobKeyError` on ``file://`` and ``s3://``
    alike. Object keys must be canonical (``a/b``: no empty, ``.`` or ``..`` segment, no leading
    or trailing ``/``), because S3 keeps ``a//b`` and ``a/b`` apart where a filesystem merges them;
    a *prefix* may be empty or end with ``/``.
    """
    if not isinstance(key, str):
        raise InvalidBlobKeyError(f"invalid key for {url}: expected a string, got {type(key).__name__}")
    reason = None
    parts = key.split("/")
    if prefix and parts and parts[-1] == "":
        parts.pop()  # "dir/" lists dir
    if not key and not prefix:
        reason = "empty key"
    elif key.startswith("/"):
        reason = "absolute keys are not allowed"
    elif _CONTROL.search(key):
        reason = "control characters (NUL, newline, …) are not allowed"
    elif any(p in {".", ".."} for p in parts):
        reason = "'.' and '..' segments are not allowed"
    elif any(p == "" for p in parts) and key:
        reason = "empty segments ('//', a trailing '/') are not allowed"
    if reason is not None:
        shown = key if len(key) <= _SHOWN else f"{key[:_SHOWN]}…"
        raise InvalidBlobKeyError(f"invalid key {scrub(shown)!r} for {url}: {reason}")
    return [p for p in parts if p]


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """One stored object: its key relative to the store root, size and last-modified time (UTC)."""

    key: str
    size: int
    modified: datetime


@runtime_checkable
class BlobStore(Protocol):
    """A handful of operations every backend offers; chosen by URL scheme in :func:`open_blob_store`."""

    @property
    def url(self) -> str:
        """The root URL, without credentials, safe to log: the store's identity (recorded in
        snapshots, handed to other processes), absolute."""
        ...

    @property
    def shown(self) -> str:
        """The location as the user gave it (a relative path stays relative), for messages."""
        ...

    def read(self, key: str) -> bytes:
        """The whole object; :class:`~statesnap.errors.BlobNotFoundError` if it is missing."""
        ...

    def write(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        """Store *data* atomically: readers see the old object, or none, or all of the new one.

        With ``if_absent`` the write fails with :class:`~statesnap.errors.BlobExistsError` when
        the key already exists, so two writers can never both commit the same object.
        """
        ...

    def exists(self, key: str) -> bool:
        """Whether *key* exists."""
        ...

    def list(self, prefix: str = "") -> builtins.list[BlobInfo]:
        """Every object under *prefix* (recursively), sorted by key."""
        ...

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The immediate "sub-directories" under *prefix*, as names without slashes."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Delete *keys*; keys that are already gone are ignored."""
        ...

    def check(self, *, writable: bool) -> None:
        """Fail fast with a typed error when the root is unusable (missing bucket, not writable)."""
        ...

    def abort_stale_uploads(self, prefix: str, older_than: datetime, *, dry_run: bool = False) -> int:
        """Abort unfinished uploads (S3 multipart, leftover temp files) started before *older_than*."""
        ...


@runtime_checkable
class CopyingBlobStore(BlobStore, Protocol):
    """A store that can copy an object without the bytes passing through this process.

    Optional: :func:`~statesnap.blob.copy_blob` falls back to ``read`` + ``write`` for a store
    without it, or when the two stores cannot copy between each other (another endpoint, other
    credentials, another filesystem).
    """

    def copy_from(self, source: BlobStore, source_key: str, key: str) -> str | None:
        """Copy *source_key* of *source* to *key* here, overwriting it; how it copied
        (``"link"``, ``"copy"``, ``"server"``) or None when this store cannot copy from *source*
        (the caller then reads and writes). A missing source is
        :class:`~statesnap.errors.BlobNotFoundError`."""
        ...
