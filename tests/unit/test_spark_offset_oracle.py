"""The Spark source's OffsetOracle opens its admin client the one way the package opens Kafka
clients (``statesnap.kafka.clients``): settings librdkafka refuses are a typed one-line error,
secrets left out. No broker: librdkafka checks settings when a client is created."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from statesnap.errors import KafkaConfigError
from statesnap.spark.kafka_io import OffsetOracle
from statesnap.spark.option_parsing import parse_options


def test_admin_settings_librdkafka_refuses_are_a_typed_error_without_secrets() -> None:
    options = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "subscribe": "t",
        "kafka.no.such.property": "x",
        "kafka.sasl.password": "hunter2-secret",
    }
    opts = parse_options(options, streaming=False, check_client=False)  # nothing checked them yet
    with pytest.raises(KafkaConfigError, match=r"no\.such\.property") as info:
        _ = OffsetOracle(opts).admin
    assert "hunter2-secret" not in str(info.value)
