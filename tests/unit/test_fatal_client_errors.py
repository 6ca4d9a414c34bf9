"""Which Kafka client errors stop a task (:mod:`statesnap.kafka.fatal`), and what is said then.

confluent-kafka's own ``KafkaError`` values are used, built as librdkafka builds them: the error
a fenced static member gets has code ``_FATAL`` and ``fatal()`` False (measured on Apache Kafka
4.1.1 with librdkafka 2.16: the integration test ``apache/test_fatal_client_errors.py`` proves the
whole path); a transactional producer's fatal error has ``fatal()`` True.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError as RdKafkaError

from statesnap.errors import FatalClientError, KafkaError
from statesnap.kafka.fatal import FatalErrors, FatalLogLines, fatal_error, is_fatal
from statesnap.kafka.outages import BrokerOutages, broker_of

FENCED_TEXT = (
    "Fatal error: Broker: Static consumer fenced by other consumer with same group.instance.id: "
    "Fatal consumer error: Broker: Static consumer fenced by other consumer with same group.instance.id"
)


def test_fatal_by_code_as_well_as_by_flag() -> None:
    by_code = RdKafkaError(RdKafkaError._FATAL, FENCED_TEXT)
    assert not by_code.fatal()  # what made the old check miss it
    assert is_fatal(by_code)
    assert is_fatal(RdKafkaError(RdKafkaError.FENCED_INSTANCE_ID))
    assert is_fatal(RdKafkaError(RdKafkaError._FENCED, "fenced", fatal=True))
    assert is_fatal(RdKafkaError(RdKafkaError.INVALID_PRODUCER_EPOCH, "epoch", fatal=True))


@pytest.mark.parametrize(
    "code",
    [
        RdKafkaError._ALL_BROKERS_DOWN,
        RdKafkaError._TRANSPORT,
        RdKafkaError._PARTITION_EOF,
        RdKafkaError.UNKNOWN_MEMBER_ID,  # librdkafka rejoins under a new member id
        RdKafkaError.FENCED_MEMBER_EPOCH,  # KIP-848: it rejoins too
        RdKafkaError.NOT_COORDINATOR,
    ],
)
def test_recoverable_errors_are_not_fatal(code: int) -> None:
    assert not is_fatal(RdKafkaError(code))


def test_not_an_error_is_not_fatal() -> None:
    assert not is_fatal(None)
    assert not is_fatal("some text")


def test_the_error_names_the_cause_and_what_to_do_in_one_line() -> None:
    error = fatal_error(
        RdKafkaError(RdKafkaError._FATAL, FENCED_TEXT),
        "consuming 'orders' in group 'g' as group.instance.id 'm-1'",
        "b1:9092,b2:9092",
    )
    assert isinstance(error, KafkaError)
    message = str(error)
    assert "\n" not in message
    assert "'orders'" in message
    assert "b1:9092,b2:9092" in message
    assert "fenced" in message
    assert "give each its own" in message
    # librdkafka's text says it twice; the error once.
    assert error.cause == "Broker: Static consumer fenced by other consumer with same group.instance.id"
    assert message.count("Static consumer fenced") == 1
    producer = fatal_error(
        RdKafkaError(RdKafkaError._FENCED, "Producer fenced", fatal=True), "producing", "b:1"
    )
    assert "stop the other instance" in str(producer)


def test_the_first_fatal_error_is_kept_and_raised_after_the_call() -> None:
    """error_cb notes it inside consume(); the poll loop raises it afterwards."""
    errors = FatalErrors("consuming 't'", "b:1")
    assert not errors.note(RdKafkaError(RdKafkaError._TRANSPORT, "b:1/1: Connect failed"))
    errors.raise_if_any()  # nothing fatal yet
    assert errors.note(RdKafkaError(RdKafkaError._FATAL, FENCED_TEXT))
    assert errors.note(RdKafkaError(RdKafkaError._FATAL, "a later one"))
    with pytest.raises(FatalClientError, match="fenced"):
        errors.raise_if_any()


class _Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, msg: str, *args: Any) -> None:
        self.lines.append((level, msg % args))


def test_librdkafka_fatal_lines_go_to_debug() -> None:
    """The typed error says it; librdkafka's CRITICAL line would say it a second time."""
    target = _Recorder()
    lines = FatalLogLines(target)
    lines.log(logging.CRITICAL, "%s [%s] %s", "FATAL", "rdkafka#consumer-1", FENCED_TEXT)
    lines.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "b:1/1: Connect failed")
    assert [level for level, _ in target.lines] == [logging.DEBUG, logging.ERROR]


def test_one_broker_down_is_said_as_such(caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka names the broker a connection failed to; the cluster answering through the
    others is said, and the same broker is not said again at once."""
    text = (
        "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
        "(after 0ms in state CONNECT)"
    )
    assert broker_of(text) == "127.0.0.1:1"
    assert broker_of("sasl_ssl://b2:9093/2: Disconnected") == "b2:9093"
    assert broker_of("1/3 brokers are down") is None
    log = logging.getLogger("test.outages")
    outages = BrokerOutages("127.0.0.1:1,127.0.0.1:9092", log, "consuming 't'")
    assert outages.note(RdKafkaError(RdKafkaError._TRANSPORT, text))
    # Kept to be checked: librdkafka says it also before it has tried the other brokers.
    assert outages.note(RdKafkaError(RdKafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert not outages.note(RdKafkaError(RdKafkaError._PARTITION_EOF))
    with caplog.at_level(logging.WARNING, logger="test.outages"):
        assert outages.report(lambda timeout: True) is None
        outages.note(RdKafkaError(RdKafkaError._TRANSPORT, text))
        assert outages.report(lambda timeout: True) is None  # said already
    (line,) = [r.getMessage() for r in caplog.records]
    assert "broker 127.0.0.1:1 (Connect to ipv4#127.0.0.1:1 failed: Connection refused) unreachable" in line
    assert "the other brokers of 127.0.0.1:1,127.0.0.1:9092 answer" in line
    assert "cluster" not in line


def test_no_broker_answering_is_left_to_the_cluster_line() -> None:
    outages = BrokerOutages("b:1", logging.getLogger("test.outages"), "consuming 't'")
    outages.note(RdKafkaError(RdKafkaError._TRANSPORT, "b:1/bootstrap: Connect to ipv4#b:1 failed: refused"))
    outages.note(RdKafkaError(RdKafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert outages.report(lambda timeout: False) == (
        "1/1 brokers are down; b:1 (Connect to ipv4#b:1 failed: refused)"
    )
    assert outages.report(lambda timeout: False) is None  # nothing new


def test_all_brokers_down_while_one_answers_says_nothing_of_the_cluster(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outages = BrokerOutages("b:1,b:2", logging.getLogger("test.outages"), "consuming 't'")
    outages.note(RdKafkaError(RdKafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    with caplog.at_level(logging.WARNING, logger="test.outages"):
        assert outages.report(lambda timeout: True) is None
    assert caplog.records == []
