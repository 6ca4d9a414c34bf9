"""A moto S3 server on loopback: a real S3 HTTP endpoint for tests and demos."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from statesnap.devstack.process import DevServiceError, LoopbackService

__all__ = ["DEV_CREDENTIALS", "EmbeddedS3"]

#: moto accepts any credentials; these only have to be present and consistent.
DEV_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "statesnap",
    "AWS_SECRET_ACCESS_KEY": "statesnap-dev-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class EmbeddedS3(LoopbackService):
    """``moto_server`` as a child process; ``client()`` and ``env`` point boto3 at it."""

    name = "moto"

    def command(self) -> Sequence[str]:
        # This interpreter's own moto first: one found on PATH may belong to another Python
        # (another moto version, another set of dependencies).
        exe = Path(sys.executable).with_name("moto_server")
        if not exe.exists():
            found = shutil.which("moto_server")
            if found is None:
                raise DevServiceError("moto_server not found: pip install 'moto[server]'")
            exe = Path(found)
        return [str(exe), "-H", self.host, "-p", str(self.port)]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(DEV_CREDENTIALS)
        return env

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients (and for the broker's S3 storage engine)."""
        return {**DEV_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ALLOW_HTTP": "true"}

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DEV_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=DEV_CREDENTIALS["AWS_REGION"],
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def storage_options(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint_url,
            "region": DEV_CREDENTIALS["AWS_REGION"],
            "aws_access_key_id": DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": DEV_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        }
