"""Kafka client settings: env parsing, properties files, pass-through and secret redaction."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statesnap.errors import ConfigError
from statesnap.kafka.config import (
    KafkaSettings,
    config_from_env,
    is_secret,
    parse_properties,
    redact,
)
from statesnap.redaction import scrub

SECRET = "hunter2-S3CR3T"


def test_env_variables_become_librdkafka_properties() -> None:
    env = {
        "STATESNAP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "STATESNAP_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "STATESNAP_KAFKA_SASL_PASSWORD": SECRET,
        "STATESNAP_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
        "STATESNAP_KAFKA_": "ignored: no property name",
        "STATESNAP_BOOTSTRAP_SERVERS": "not a kafka property",
        "KAFKA_SASL_USERNAME": "other prefix",
        "PATH": "/usr/bin",
    }
    assert config_from_env(env) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": SECRET,
        "ssl.ca.location": "/etc/ca.pem",
    }


def test_env_is_read_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATESNAP_KAFKA_CLIENT_RACK", "az1")
    assert config_from_env() == {"client.rack": "az1"}
    assert config_from_env({}) == {}


def test_user_config_wins_over_defaults_and_overrides_win_over_both() -> None:
    s = KafkaSettings("b:9092", {"client.id": "mine", "sasl.password": SECRET})
    conf = s.client_config(**{"group.id": "g"})
    assert conf["bootstrap.servers"] == "b:9092"
    assert conf["client.id"] == "mine"
    assert conf["sasl.password"] == SECRET  # passed through to librdkafka untouched
    assert conf["group.id"] == "g"
    assert s.client_config(**{"client.id": "forced"})["client.id"] == "forced"


@pytest.mark.parametrize("bootstrap", ["", "   "])
def test_bootstrap_servers_are_required(bootstrap: str) -> None:
    with pytest.raises(ConfigError, match="bootstrap"):
        KafkaSettings(bootstrap)


# Every property librdkafka itself flags as sensitive (_RK_SENSITIVE in rdkafka_conf.c) that
# carries a secret, plus the Java client's names users copy over.
SECRET_PROPERTIES = [
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.key.pem",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.config",
    "sasl.jaas.config",
    "SASL.PASSWORD",
]


@pytest.mark.parametrize("name", SECRET_PROPERTIES)
def test_secret_properties_are_recognized(name: str) -> None:
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    ["bootstrap.servers", "security.protocol", "sasl.mechanism", "ssl.ca.location", "client.id", "group.id"],
)
def test_ordinary_properties_are_not_secret(name: str) -> None:
    assert not is_secret(name)


@pytest.mark.parametrize("name", SECRET_PROPERTIES)
def test_secrets_never_appear_in_repr_or_str(name: str) -> None:
    s = KafkaSettings("b:9092", {name: SECRET, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"})
    for text in (repr(s), str(s), f"{s}", repr(redact(s.config))):
        assert SECRET not in text, text
    assert "SASL_SSL" in repr(s)  # non-secrets stay visible for debugging
    assert redact(s.config)[name] == "***"


def test_redact_does_not_mutate_the_input() -> None:
    conf = {"sasl.password": SECRET}
    assert redact(conf) == {"sasl.password": "***"}
    assert conf == {"sasl.password": SECRET}


def test_properties_files_and_pairs(tmp_path: Path) -> None:
    f = tmp_path / "client.properties"
    f.write_text(
        "# a comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.password=a=b=c\nsasl.mechanism=PLAIN\n"
    )
    got = parse_properties(["sasl.mechanism=SCRAM-SHA-256", "x.y= spaced "], [str(f)])
    assert got == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "a=b=c",  # only the first '=' separates
        "sasl.mechanism": "SCRAM-SHA-256",  # pairs win over files
        "x.y": " spaced ",
    }


@pytest.mark.parametrize("pair", ["novalue", "=value", "  =v"])
def test_bad_pairs_are_config_errors(pair: str) -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_properties([pair])


def test_bad_properties_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        parse_properties(files=[str(tmp_path / "missing.properties")])
    bad = tmp_path / "bad.properties"
    bad.write_text(f"# comment\n: {SECRET}\n")
    with pytest.raises(ConfigError, match="line 2") as info:
        parse_properties(files=[str(bad)])
    assert SECRET not in str(info.value)


def test_properties_files_accept_every_java_separator(tmp_path: Path) -> None:
    """java.util.Properties separates a key from its value by '=', ':' or whitespace; a file
    written for the Java client (``sasl.password: x``) must not be refused, let alone echoed."""
    f = tmp_path / "java.properties"
    f.write_text(
        f"sasl.password: {SECRET}\n"
        "sasl.username   alice\n"
        "ssl.ca.location=/etc/ca.pem\n"
        "long.value = first \\\n    second\n"
        "empty.value\n"
    )
    assert parse_properties(files=[str(f)]) == {
        "sasl.password": SECRET,
        "sasl.username": "alice",
        "ssl.ca.location": "/etc/ca.pem",
        "long.value": "first second",
        "empty.value": "",
    }


# --- errors name the entry and the property, never the value (issue 11) -----------------------


@pytest.mark.parametrize(
    ("pairs", "named"),
    [
        ([f"sasl.password {SECRET}"], "sasl.password"),  # a space instead of '='
        ([f"sasl.password: {SECRET}"], "sasl.password"),  # Java-style separator on the CLI
        ([SECRET], None),  # a lone word may itself be the secret: not echoed at all
        (["security.protocol=SASL_SSL", f"{SECRET} x=1"], None),  # a "key" with a space
    ],
)
def test_malformed_pairs_never_echo_the_value(pairs: list[str], named: str | None) -> None:
    with pytest.raises(ConfigError, match=f"entry {len(pairs)}") as info:
        parse_properties(pairs)
    message = str(info.value)
    assert SECRET not in message
    if named is not None:
        assert repr(named) in message


@pytest.mark.parametrize(
    "pair", ["sasl.password UnparsedPaste-71d2", "UnparsedPaste-71d2", "Unparsed Paste-71d2=x"]
)
def test_an_entry_that_fails_to_parse_is_masked_afterwards(pair: str) -> None:
    """Issue 22: a value that fails to parse may be a pasted secret; besides not being echoed, it
    is masked in any log line that quotes it later."""
    from statesnap.redaction import scrub

    with pytest.raises(ConfigError):
        parse_properties([pair])
    assert "Paste-71d2" not in scrub(f"librdkafka: cannot use {pair}")


def test_settings_register_their_secrets_for_the_log_scrubber() -> None:
    from statesnap.redaction import scrub

    value = "kafka-" + SECRET + "-registered"
    assert scrub(f"librdkafka said: auth failed for {value}") != "librdkafka said: auth failed for ***"
    KafkaSettings("b:9092", {"sasl.password": value})
    assert scrub(f"librdkafka said: auth failed for {value}") == "librdkafka said: auth failed for ***"


# --- credentials in the broker list (issue 22) ---------------------------------------------------


@pytest.mark.parametrize(
    "bootstrap",
    [
        f"alice:{SECRET}@127.0.0.1:9092",
        f"{SECRET}@127.0.0.1:9092",
        f"SASL_SSL://alice:{SECRET}@broker:9093",
        f"b1:9092,SASL_SSL://alice:{SECRET}@b2:9093",
        f"b1:9092, alice:p@ss{SECRET}@b2:9093",
        f"SASL_SSL://alice:{SECRET}/x@b2:9093",
    ],
)
def test_credentials_in_the_broker_list_are_refused_without_echoing_them(bootstrap: str) -> None:
    """The list was named, whole, in every connection error ("no Kafka broker answered at
    user:SECRET@…"); librdkafka has no userinfo there, so it is refused, the entry named by number."""
    from statesnap.redaction import scrub

    attempts: tuple[Callable[[], KafkaSettings], ...] = (
        lambda: KafkaSettings(bootstrap),
        lambda: KafkaSettings("127.0.0.1:9092", {"bootstrap.servers": bootstrap}),
    )
    for settings in attempts:
        with pytest.raises(ConfigError, match="carries credentials") as info:
            settings()
        message = str(info.value)
        assert SECRET not in message
        assert "alice" not in message
        assert "sasl.username" in message
        assert "\n" not in message
    assert SECRET not in scrub(f"connect to {bootstrap.split('@')[-2]} failed")  # registered


@pytest.mark.parametrize(
    "bootstrap", ["127.0.0.1:9092", "SASL_SSL://b1:9093,PLAINTEXT://b2:9092", "[::1]:9092"]
)
def test_plain_broker_lists_are_accepted(bootstrap: str) -> None:
    assert KafkaSettings(bootstrap).client_config()["bootstrap.servers"] == bootstrap


# --- librdkafka refuses a setting: a typed error naming the property (issue 11) ---------------


@pytest.mark.parametrize("factory", ["new_admin", "new_consumer", "new_producer"])
@pytest.mark.parametrize(
    ("config", "prop", "text"),
    [
        ({"no.such.prop": "1"}, "no.such.prop", "unknown Kafka client property 'no.such.prop'"),
        ({"security.protocol": "bogus"}, "security.protocol", "invalid value"),
        ({"socket.timeout.ms": "abc"}, "socket.timeout.ms", "'socket.timeout.ms'"),
        # The README's SASL example without credentials.
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, None, "sasl.password must be set"),
        ({"sasl.jaas.config": f'x required password="{SECRET}";'}, None, "JAAS"),
        (
            {"sasl.mechanism": "PLAIN", "sasl.password": "x", "sasl.passwort": SECRET},
            "sasl.passwort",
            "unknown",
        ),
    ],
)
def test_client_config_errors_are_typed_and_name_the_property(
    factory: str, config: dict[str, str], prop: str | None, text: str
) -> None:
    from statesnap.errors import KafkaConfigError
    from statesnap.kafka import clients

    settings = KafkaSettings("127.0.0.1:1", config)
    overrides = {"group.id": "g"} if factory == "new_consumer" else {}
    with pytest.raises(KafkaConfigError) as info:
        getattr(clients, factory)(settings, **overrides)
    assert isinstance(info.value, ConfigError)
    assert text in str(info.value)
    assert info.value.property == prop
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None  # librdkafka's text (which may quote values) is not chained
    assert "\n" not in str(info.value)


def test_an_invalid_secret_value_is_not_echoed() -> None:
    """librdkafka quotes the value it refuses; for a secret property the typed error must not
    (no secret property of this librdkafka has a checked type, so the refusal is constructed)."""
    from confluent_kafka import KafkaError as RdKafkaError
    from confluent_kafka import KafkaException

    from statesnap.kafka.clients import config_error

    refusal = KafkaException(
        RdKafkaError(
            RdKafkaError._INVALID_ARG, f'Invalid value "{SECRET}" for configuration property "sasl.password"'
        )
    )
    err = config_error(refusal, {"sasl.password": SECRET})
    assert err.property == "sasl.password"
    assert SECRET not in str(err)
    assert str(err) == "invalid value for Kafka client property 'sasl.password'"
    other = config_error(
        KafkaException(RdKafkaError(RdKafkaError._INVALID_ARG, f"Failed to create consumer: bad {SECRET}")),
        {"ssl.key.password": SECRET},
    )
    assert SECRET not in str(other)


def test_a_refused_value_of_any_property_is_not_echoed() -> None:
    """A value that fails to parse may be a secret pasted in the wrong place
    (``--kafka-config fetch.wait.max.ms=<password>``): librdkafka refuses it, and the typed error
    must name the property only. Proven on librdkafka itself (no broker needed)."""
    from statesnap.errors import KafkaConfigError
    from statesnap.kafka import clients

    with pytest.raises(KafkaConfigError) as info:
        clients.new_consumer(KafkaSettings("127.0.0.1:1", {"group.id": "g", "fetch.wait.max.ms": SECRET}))
    assert info.value.property == "fetch.wait.max.ms"
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("protocol", ["SASL_SSL", "sasl_plaintext"])
def test_sasl_without_a_mechanism_says_to_set_sasl_mechanism(protocol: str) -> None:
    """librdkafka defaults the mechanism to GSSAPI, which the confluent-kafka wheels are built
    without: the client's creation would fail with "No provider for SASL mechanism GSSAPI:
    recompile librdkafka…". The settings say which property to set, in one line, before any
    client exists, and show no secret."""
    from statesnap.errors import KafkaConfigError

    config = {"security.protocol": protocol, "sasl.username": "u", "sasl.password": SECRET}
    with pytest.raises(KafkaConfigError) as info:
        KafkaSettings("127.0.0.1:1", config)
    message = str(info.value)
    assert "set sasl.mechanism (e.g. SCRAM-SHA-512 or PLAIN" in message
    assert f"security.protocol={protocol.upper()}" in message
    assert info.value.property == "sasl.mechanism"
    assert "recompile" not in message
    assert SECRET not in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "config",
    [
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"},
        {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN"},  # librdkafka's older name
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"},  # Kerberos, named
        {"security.protocol": "SSL"},
        {},
    ],
)
def test_a_named_mechanism_or_no_sasl_is_accepted(config: dict[str, str]) -> None:
    assert KafkaSettings("127.0.0.1:1", config).config == config


def test_the_sasl_hint_speaks_the_callers_option_names() -> None:
    """The Spark source's options carry a ``kafka.`` prefix; the hint names them so."""
    from statesnap.errors import KafkaConfigError
    from statesnap.kafka.config import check_sasl_mechanism

    with pytest.raises(KafkaConfigError, match=r"set kafka\.sasl\.mechanism \(e\.g\. SCRAM-SHA-512"):
        check_sasl_mechanism({"security.protocol": "SASL_SSL"}, prefix="kafka.")


def test_schema_registry_properties_are_taken_out_of_the_client_config() -> None:
    """``schema.registry.*`` sits in the same properties as the client's, as Kafka Streams takes
    it; librdkafka refuses names it does not know, so they never reach it, and a credential in
    them is masked like any client secret."""
    settings = KafkaSettings(
        "k:9092",
        {
            "security.protocol": "SSL",
            "schema.registry.url": "http://registry:8081",
            "schema.registry.basic.auth.user.info": "reg-user:reg-Secret-41",
        },
    )
    assert settings.schema_registry == {
        "url": "http://registry:8081",
        "basic.auth.user.info": "reg-user:reg-Secret-41",
    }
    client = settings.client_config()
    assert not [key for key in client if key.startswith("schema.registry")]
    assert client["security.protocol"] == "SSL"
    assert KafkaSettings("k:9092", {"acks": "all"}).schema_registry is None
    assert "reg-Secret-41" not in scrub("registry said: reg-user:reg-Secret-41")


def test_a_table_and_a_processor_take_their_registry_from_kafka_config() -> None:
    """The registry serdes resolve with the registry of ``kafka_config``; without one, one line
    says where it goes."""
    from statesnap import Processor, Table
    from statesnap.serde import AvroSerde

    config = {"schema.registry.url": "http://registry:8081"}
    table: Table[Any, Any] = Table(
        "orders", bootstrap_servers="k:9092", value_serde="avro", kafka_config=config
    )
    assert isinstance(table.value_serde, AvroSerde)
    proc = Processor("p", "orders", bootstrap_servers="k:9092", value_serde="avro", kafka_config=config)
    assert isinstance(proc.value_serde, AvroSerde)
    with pytest.raises(ConfigError, match=r"set schema\.registry\.url in kafka_config"):
        Table("orders", bootstrap_servers="k:9092", value_serde="avro")


def _warned(kind: type[Any], config: dict[str, Any]) -> list[str]:
    """What librdkafka logs while a client of *kind* is created with *config* (no broker)."""
    records: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger(f"test.confwarn.{uuid.uuid4().hex}")
    logger.addHandler(Catch())
    logger.propagate = False
    client = kind({"bootstrap.servers": "127.0.0.1:1", **config, "logger": logger})
    if hasattr(client, "close"):
        client.close()
    return [r for r in records if "will be ignored" in r]


def test_each_client_gets_the_part_of_kafka_config_it_uses() -> None:
    """One ``kafka_config`` serves statesnap's consumers, producers and admin clients: a consumer
    property (``group.instance.id``, which exactly-once groups want) in a producer, or a producer
    property in a consumer, made librdkafka warn at every start. Every name in the two lists is
    checked against librdkafka itself: it does warn for the other kind of client, and the
    client's own config is then quiet."""
    from confluent_kafka import Consumer, Producer

    from statesnap.kafka.config import CONSUMER_ONLY, PRODUCER_ONLY

    samples = {"isolation.level": "read_committed", "auto.offset.reset": "earliest",
               "partition.assignment.strategy": "range", "group.protocol": "classic",
               "group.protocol.type": "consumer", "group.remote.assignor": "uniform",
               "compression.codec": "lz4", "compression.type": "lz4", "partitioner": "murmur2",
               "acks": "all", "request.required.acks": "all", "transactional.id": "t",
               "enable.idempotence": True, "enable.gapless.guarantee": False,
               "enable.auto.commit": False, "enable.auto.offset.store": False,
               "enable.partition.eof": True, "check.crcs": True, "group.id": "g",
               "group.instance.id": "i", "delivery.report.only.error": False,
               "compression.level": 3, "batch.num.messages": 100, "retries": 3,
               "message.send.max.retries": 3}  # fmt: skip

    def value(name: str) -> Any:
        return samples.get(name, 6000)

    for name in sorted(CONSUMER_ONLY):
        assert _warned(Producer, {name: value(name)}), f"{name} is not consumer-only"
    for name in sorted(PRODUCER_ONLY):
        assert _warned(Consumer, {"group.id": "g", name: value(name)}), f"{name} is not producer-only"
    mixed = KafkaSettings("127.0.0.1:1", {"group.instance.id": "i", "acks": "all", "client.rack": "r"})
    assert _warned(Producer, {k: v for k, v in mixed.producer_config().items() if k != "logger"}) == []
    consumer = {k: v for k, v in mixed.consumer_config(**{"group.id": "g"}).items() if k != "logger"}
    assert _warned(Consumer, consumer) == []
    assert mixed.producer_config()["client.rack"] == mixed.consumer_config()["client.rack"] == "r"
