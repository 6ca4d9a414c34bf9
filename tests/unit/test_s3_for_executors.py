"""S3 settings the driver takes from its environment travel to Spark executors inside the store.

Executors on other machines do not share the driver's environment; the store pickles by its
options, so ``for_executors`` writes the endpoint, region and credentials the driver resolved into
them (reproduced on a standalone cluster: without it executors fail with "Unable to locate
credentials"). Explicit options always win.
"""

from __future__ import annotations

import pickle

import pytest

from statesnap.blob.s3 import S3BlobStore


@pytest.fixture
def driver_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIADRIVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "driver-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9999")


def test_the_driver_environment_is_written_into_the_store(driver_env: None) -> None:
    store = pickle.loads(pickle.dumps(S3BlobStore("bucket", "prefix").for_executors()))
    assert store.options == {
        "endpoint_url": "http://127.0.0.1:9999",
        "region": "eu-west-3",
        "aws_access_key_id": "AKIADRIVER",
        "aws_secret_access_key": "driver-secret",
    }
    assert "driver-secret" not in repr(store)
    assert store.safe_options["aws_secret_access_key"] == "***"


def test_explicit_options_win(driver_env: None) -> None:
    store = S3BlobStore(
        "bucket",
        endpoint_url="http://other:1",
        region="us-east-1",
        aws_access_key_id="A",
        aws_secret_access_key="B",
    ).for_executors()
    assert store.options["endpoint_url"] == "http://other:1"
    assert store.options["region"] == "us-east-1"
    assert (store.options["aws_access_key_id"], store.options["aws_secret_access_key"]) == ("A", "B")
