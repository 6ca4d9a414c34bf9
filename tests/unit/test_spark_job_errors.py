"""``python -m statesnap.spark`` (the job spark-submit runs) prints a typed error as one line,
scrubbed of secrets like the ``statesnap`` command's, whichever module built the message. No
broker and no Spark session: the command class alone."""

from __future__ import annotations

import click
import pytest

pytest.importorskip("pyspark")

from statesnap.errors import ConfigError
from statesnap.spark.__main__ import _SparkJob


def test_a_typed_error_is_one_scrubbed_line() -> None:
    def fail() -> None:
        raise ConfigError("cannot connect with sasl.password=hunter2-secret")

    job = _SparkJob("job", callback=fail)
    with pytest.raises(click.ClickException) as info:
        job.main(args=[], standalone_mode=False)
    message = info.value.format_message()
    assert message.startswith("ConfigError: cannot connect with sasl.password=")
    assert "hunter2-secret" not in message
    assert "\n" not in message
