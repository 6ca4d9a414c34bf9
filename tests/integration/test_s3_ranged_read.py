"""S3 reads of large objects use parallel ranged GETs and return exactly the object's bytes.

Against the moto server (a real S3 HTTP endpoint); the part size is shrunk so small objects
take the multi-part path.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from statesnap.blob import open_blob_store
from statesnap.blob import s3 as s3_module
from statesnap.errors import BlobNotFoundError

pytestmark = pytest.mark.integration


def s3_store(location: Any) -> s3_module.S3BlobStore:
    """The store under test: an s3:// URL opens the S3 backend, whose boto3 client these tests wrap."""
    store = open_blob_store(location.url, **location.options)
    assert isinstance(store, s3_module.S3BlobStore)
    return store


class CountingClient:
    """Wraps the boto3 client to record the Range of every GET (and run a hook after one)."""

    def __init__(self, client: Any, after_first: Any = None) -> None:
        self._client = client
        self.ranges: list[str | None] = []
        self._after_first = after_first

    def get_object(self, **kwargs: Any) -> Any:
        self.ranges.append(kwargs.get("Range"))
        resp = self._client.get_object(**kwargs)
        if len(self.ranges) == 1 and self._after_first is not None:
            hook, self._after_first = self._after_first, None
            hook()
        return resp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(s3_module, "READ_PART", 1000)
    return 1000


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 10_500, 64_000])
def test_ranged_read_returns_the_same_bytes(s3_location: Any, small_parts: int, size: int) -> None:
    store = s3_store(s3_location)
    data = os.urandom(size)
    store.write("data/obj.bin", data)
    counting = CountingClient(store.client)
    store._client = counting
    assert store.read("data/obj.bin") == data
    parts = max(1, -(-size // small_parts))
    assert len(counting.ranges) == parts + (1 if size == 0 else 0)  # an empty object: 416, then a GET
    if size > small_parts:
        assert counting.ranges[0] == "bytes=0-999"
        assert counting.ranges[-1] == f"bytes={(parts - 1) * small_parts}-{size - 1}"


def test_an_object_replaced_mid_read_is_read_again_whole(s3_location: Any, small_parts: int) -> None:
    """Parts are fetched with If-Match on the first part's ETag: an overwrite between parts
    restarts the read instead of returning a mix of two versions."""
    store = s3_store(s3_location)
    old, new = b"a" * 5000, b"b" * 4200
    store.write("obj", old)
    raw = store.client
    counting = CountingClient(
        raw, after_first=lambda: raw.put_object(Bucket=s3_location.bucket, Key="checkpoints/obj", Body=new)
    )
    store._client = counting
    assert store.read("obj") == new
    assert counting.ranges.count("bytes=0-999") == 2  # started over once


def test_missing_object_is_a_typed_error(s3_location: Any, small_parts: int) -> None:
    store = open_blob_store(s3_location.url, **s3_location.options)
    with pytest.raises(BlobNotFoundError):
        store.read("nope")
