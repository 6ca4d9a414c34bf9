"""The :class:`BlobStore` protocol: the only way statesnap touches files or object storage.

Keys are ``/``-separated paths relative to the store's root URL. Stores pickle by configuration
(URL + options), never by live clients, so they can travel to Spark executors.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable


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
        """The root URL, without credentials, safe to log."""
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
