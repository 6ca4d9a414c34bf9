"""Blob store on a local (or mounted) filesystem: ``file:///path`` or a bare path.

Writes go to a temporary sibling, are fsynced, then published: by ``rename`` for plain writes and
by ``link`` for write-once ones, because ``link`` fails if the target exists where ``rename`` would
silently replace it.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from statesnap.blob.base import BlobInfo, BlobStore, key_parts
from statesnap.errors import (
    BlobExistsError,
    BlobNotFoundError,
    BlobStoreError,
    InvalidStoreUrlError,
    StoreNotWritableError,
)

__all__ = ["FileBlobStore"]

_TMP_MARK = ".tmp-"


class FileBlobStore:
    """A directory tree holding the blobs; created lazily on the first write."""

    def __init__(self, root: str | os.PathLike[str], *, shown: str | None = None) -> None:
        """*shown*: the location as the user wrote it (``./ckpt``, ``file:///data/c``), which
        messages print; default *root* as given."""
        if "\x00" in os.fspath(root):
            raise InvalidStoreUrlError("checkpoint path contains a NUL byte (%00)")
        self._root = Path(root).expanduser().absolute()
        self._shown = shown if shown is not None else os.fspath(root)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (str(self._root), self._shown))

    def __repr__(self) -> str:
        return f"FileBlobStore({self.url!r})"

    @property
    def url(self) -> str:
        return self._root.as_uri()

    @property
    def shown(self) -> str:
        return self._shown

    @property
    def root(self) -> Path:
        return self._root

    def _path(self, key: str, *, prefix: bool = False) -> Path:
        return self._root.joinpath(*key_parts(key, url=self.url, prefix=prefix))

    def read(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise BlobNotFoundError(f"{self.shown}/{key} does not exist") from e
        except IsADirectoryError as e:
            raise BlobNotFoundError(f"{self.shown}/{key} is a directory, not a file") from e
        except OSError as e:
            raise BlobStoreError(f"cannot read {self.shown}/{key}: {e.strerror}") from e

    def write(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        target = self._path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}{_TMP_MARK}{uuid.uuid4().hex}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if if_absent:
                    try:
                        os.link(tmp, target)
                    except FileExistsError as e:
                        raise BlobExistsError(f"{self.shown}/{key} already exists") from e
                else:
                    os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            _fsync_dir(target.parent)
        except BlobStoreError:
            raise
        except OSError as e:
            # Permissions, a read-only or full filesystem, a file where a directory should be, a
            # root under /proc: every one means this location cannot hold checkpoints.
            reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
            raise StoreNotWritableError(f"cannot write {self.shown}/{key}: {reason}") from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def copy_from(self, source: BlobStore, source_key: str, key: str) -> str | None:
        """A hard link when both are on one filesystem (no bytes copied; objects are never
        modified in place, every write replaces, so the two names stay independent: deleting one
        leaves the other), else a file copy; None for a store that is not a directory."""
        if not isinstance(source, FileBlobStore):
            return None
        origin, target = source._path(source_key), self._path(key)
        if not origin.is_file():
            raise BlobNotFoundError(f"{source.shown}/{source_key} does not exist")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}{_TMP_MARK}{uuid.uuid4().hex}")
            try:
                try:
                    os.link(origin, tmp)
                    # A link keeps the source's modification time; GC judges unreferenced files
                    # by it, so a target's GC before its manifest lands would see an old orphan.
                    os.utime(tmp)
                    how = "link"
                except OSError as e:
                    if e.errno not in {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP}:
                        raise
                    with open(origin, "rb") as src, open(tmp, "xb") as dst:
                        shutil.copyfileobj(src, dst)
                        dst.flush()
                        os.fsync(dst.fileno())
                    how = "copy"
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            _fsync_dir(target.parent)
        except FileNotFoundError as e:
            raise BlobNotFoundError(f"{source.shown}/{source_key} does not exist") from e
        except OSError as e:
            reason = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
            raise StoreNotWritableError(f"cannot copy to {self.shown}/{key}: {reason}") from e
        return how

    def list(self, prefix: str = "") -> builtins.list[BlobInfo]:
        """Tolerates concurrent deletes: GC may remove files and whole directories mid-walk."""
        base = self._path(prefix, prefix=True)
        out = []
        for path, st in self._walk(base, prefix):
            if _TMP_MARK in path.name:
                continue
            key = path.relative_to(self._root).as_posix()
            out.append(BlobInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)))
        out.sort(key=lambda b: b.key)
        return out

    def _walk(self, base: Path, prefix: str) -> Iterator[tuple[Path, os.stat_result]]:
        """Regular files under *base* (or *base* itself) with their stat; vanished ones skipped."""
        try:
            st = base.stat()
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            raise BlobStoreError(f"cannot list {self.shown}/{prefix}: {e.strerror}") from e
        if stat.S_ISREG(st.st_mode):
            yield base, st
            return
        pending = [base]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    found = list(entries)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed (by GC) since we saw it
            except OSError as e:
                raise BlobStoreError(f"cannot list {self.shown}/{prefix}: {e.strerror}") from e
            for entry in found:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(Path(entry.path))
                    elif entry.is_file():
                        yield Path(entry.path), entry.stat()
                except FileNotFoundError:
                    continue

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        base = self._path(prefix, prefix=True)
        try:
            with os.scandir(base) as entries:
                found = list(entries)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise BlobStoreError(f"cannot list {self.shown}/{prefix}: {e.strerror}") from e
        names = []
        for entry in found:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    names.append(entry.name)
        return sorted(names)

    def delete(self, keys: Iterable[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as e:
                raise BlobStoreError(f"cannot delete {self.shown}/{key}: {e.strerror}") from e
            parents.add(path.parent)
        # Remove directories the deletes emptied (data/<generation>/), deepest first.
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                if parent != self._root and parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()

    def check(self, *, writable: bool) -> None:
        probe = self._root
        while not probe.exists():
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise StoreNotWritableError(f"{self.shown}: {probe} is not a directory")
        if writable and not os.access(probe, os.W_OK | os.X_OK):
            raise StoreNotWritableError(f"{self.shown}: directory {probe} is not writable")

    def abort_stale_uploads(self, prefix: str, older_than: datetime, *, dry_run: bool = False) -> int:
        """Remove temporary files a crashed writer left behind (the local analogue of multipart)."""
        base = self._path(prefix, prefix=True)
        removed = 0
        cutoff = older_than.timestamp()
        for path, st in self._walk(base, prefix):
            if _TMP_MARK in path.name and st.st_mtime < cutoff:
                if not dry_run:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                removed += 1
        return removed


def _fsync_dir(path: Path) -> None:
    """Make a rename or link durable: the directory entry must reach the disk too."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reopen(root: str, shown: str) -> FileBlobStore:
    """Unpickling (Spark ships stores to its workers): the same root, shown as the user gave it."""
    return FileBlobStore(root, shown=shown)
