"""Spark Kafka source options, Java-client settings and offset planning, without a broker.

Planning runs against :class:`FakeCluster`, a precise model of what a Kafka cluster answers:
ListOffsets earliest (log start), latest (log end) and by timestamp (the first offset whose
record timestamp is >= the one asked for, none when no record is that recent — Kafka's
``offsetsForTimes``). The dev broker answers 0 to every timestamp query, so this fake is where
the timestamp *mapping* is proven; tests/integration/spark/test_source_options.py proves the same
options end to end on the real broker for what it can answer. Retention (a log start above 0)
cannot happen on the dev broker either, so offsets-deleted data loss is proven here too. On Apache
Kafka, tests/integration/apache/test_spark_source.py proves the timestamp options against real
``offsetsForTimes`` answers and the same rows as Spark's own ``format("kafka")``.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from statesnap.errors import ConfigError, DataLossError, KafkaConfigError
from statesnap.spark.java_settings import translate
from statesnap.spark.kafka_io import split_ranges
from statesnap.spark.option_parsing import parse_options
from statesnap.spark.options import (
    TP,
    KafkaSourceOptions,
    PartitionOffsets,
    Subscription,
    Timestamps,
)
from statesnap.spark.planning import (
    TriggerGate,
    continue_from,
    decode_offsets,
    encode_offsets,
    initial_offsets,
    plan_batch,
    rate_limit,
)

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}


def parse(**options: str | bool | None) -> KafkaSourceOptions:
    """The source's options over BASE; ``streaming`` (default False, a batch read) is the mode, not an
    option, taken out here so the tests can pass option names built at run time."""
    streaming = options.pop("streaming", False)
    assert streaming is None or isinstance(streaming, bool)
    merged = {**BASE, **options}
    if any(k in options for k in ("assign", "subscribePattern")):
        merged.pop("subscribe")
    return parse_options(merged, streaming=streaming)


# --- subscription and offsets -------------------------------------------------------------------


def test_subscribe_several_topics_pattern_and_assign() -> None:
    assert parse(subscribe=" a, b,,a ").strategy == Subscription("subscribe", ("a", "b"))
    pattern = parse(subscribePattern="orders-.*").strategy
    assert pattern.matches("orders-eu")
    assert not pattern.matches("x-orders-eu")  # Java's matches(): the whole name
    assert not Subscription("subscribePattern", pattern=".*").matches("__consumer_offsets")
    assigned = parse(assign='{"a":[0,2],"b":[1]}').strategy
    assert assigned.assigned == (("a", 0), ("a", 2), ("b", 1))
    assert assigned.topics == ("a", "b")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": None}, "One of the following options must be specified for Kafka source: assign"),
        ({"assign": '{"t":[0]}'}, "Only one of the following options can be specified"),
        ({"subscribe": " , "}, "option subscribe names no topic"),
        ({"subscribe": None, "subscribePattern": "("}, "option subscribePattern"),
        ({"subscribe": None, "assign": "[0]"}, "option assign"),
        ({"subscribe": None, "assign": '{"t":["x"]}'}, "option assign"),
        ({"startingOffsets": '{"other":{"0":1}}'}, "startingOffsets names topic 'other'"),
        ({"subscribe": "a,b", "startingOffsets": '{"0":1}'}, "must name the topic of each partition"),
        ({"startingOffsets": '{"t":{"0":-3}}'}, "startingOffsets"),
        ({"startingOffsets": "latest"}, "starting offset can't be latest for batch queries on Kafka"),
        ({"startingOffsets": '{"t":{"0":-1}}'}, "startingOffsets for t-0 can't be latest"),
        ({"endingOffsets": "earliest"}, "ending offset can't be earliest for batch queries on Kafka"),
        ({"endingOffsets": '{"t":{"0":-2}}'}, "ending offset for t-0 can't be earliest"),
        ({"startingOffsets": '{"t":{"0":9}}', "endingOffsets": '{"t":{"0":5}}'}, "before startingOffsets"),
        ({"startingTimestamp": "yesterday"}, "option startingTimestamp"),
        ({"startingOffsetsByTimestamp": '{"t":{"0":-5}}'}, "startingOffsetsByTimestamp"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, "startingOffsetsByTimestampStrategy"),
        ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger"),
        ({"maxTriggerDelay": "soon"}, "option maxTriggerDelay"),
        ({"fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries"),
        ({"includeHeaders": "maybe"}, "includeHeaders"),
        ({"startingOfsets": "earliest"}, "option startingOfsets is not an option"),
        ({"topic": "t"}, "option topic is not supported"),
        ({"kafka.bootstrap.servers": None}, "Option 'kafka.bootstrap.servers' must be specified"),
    ],
)
def test_bad_options_fail_in_one_line_naming_the_option(options: dict[str, str | None], message: str) -> None:
    merged = {k: v for k, v in {**BASE, **options}.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        parse_options(merged, streaming=False)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("startingOffset", "did you mean startingOffsets?"),
        ("maxOfsetsPerTrigger", "did you mean maxOffsetsPerTrigger?"),
        ("failOnDataLos", "did you mean failOnDataLoss?"),
        ("fetchOffset.numRetry", "did you mean fetchOffset.numRetries?"),
    ],
)
def test_a_typo_is_answered_with_the_documented_spelling(typo: str, suggestion: str) -> None:
    """Spark lower-cases option names before a Python data source sees them (its own
    ``CaseInsensitiveDict``, used here as Spark uses it): the error says so and suggests the
    option's documented camelCase name, not a lower-cased one the user never wrote."""
    from pyspark.sql.datasource import CaseInsensitiveDict

    with pytest.raises(ConfigError) as info:
        parse_options(CaseInsensitiveDict({**BASE, typo: "1"}), streaming=False)
    message = str(info.value)
    assert message.startswith(f"option {typo.lower()} (Spark passes option names lower-cased) is not")
    assert message.endswith(suggestion)
    assert "\n" not in message


def test_offsets_json_timestamps_and_their_precedence() -> None:
    opts = parse(subscribe="a,b", startingOffsets='{"a":{"0":5,"1":-2},"b":{"0":-2}}')
    assert opts.starting == PartitionOffsets({("a", 0): 5, ("a", 1): -2, ("b", 0): -2})
    assert parse(startingOffsets='{"0":7}').starting == PartitionOffsets({("t", 0): 7})  # one topic: bare map
    # Spark's precedence: *Timestamp over *OffsetsByTimestamp over *Offsets.
    both = parse(
        startingTimestamp="1000", startingOffsetsByTimestamp='{"t":{"0":5}}', startingOffsets="earliest"
    )
    assert both.starting == Timestamps("startingTimestamp", every=1000)
    by_ts = parse(endingOffsetsByTimestamp='{"t":{"1":2000}}', endingOffsets="latest")
    assert by_ts.ending == Timestamps("endingOffsetsByTimestamp", per_partition={("t", 1): 2000})
    # The old constructor form (a dict of partitions of `topic`) still works.
    legacy = KafkaSourceOptions("h:1", "t", starting={0: 3})
    assert legacy.starting == PartitionOffsets({("t", 0): 3})
    assert legacy.strategy == Subscription("subscribe", ("t",))


def test_mode_rules_stream_defaults_and_trigger_options() -> None:
    stream = parse(streaming=True, minOffsetsPerTrigger="10", maxTriggerDelay="30s")
    assert stream.starting == "latest"  # Spark's default for streams
    assert (stream.min_offsets_per_trigger, stream.max_trigger_delay_ms) == (10, 30_000)
    assert parse(maxTriggerDelay="1500").max_trigger_delay_ms == 1500  # a bare number is ms, as in Spark
    assert parse(maxTriggerDelay="2min").max_trigger_delay_ms == 120_000
    assert parse().max_trigger_delay_ms == 15 * 60_000
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        value = "latest" if name == "endingOffsets" else ('{"t":{"0":1}}' if "By" in name else "1")
        with pytest.raises(ConfigError, match=f"option {name} is only for batch reads"):
            parse(streaming=True, **{name: value})
    # load() does not know the mode yet: neither mode's rules apply there.
    assert parse(streaming=None, startingOffsets="latest", endingOffsets="latest").starting == "latest"
    accepted = parse(
        groupIdPrefix="etl",
        includeHeaders="true",
        **{"fetchOffset.numRetries": "5", "fetchOffset.retryIntervalMs": "20", "kafka.group.id": "g"},
    )
    assert (accepted.group_id_prefix, accepted.include_headers) == ("etl", True)
    assert (accepted.fetch_retries, accepted.fetch_retry_interval_ms) == (5, 20)
    assert accepted.kafka_config["group.id"] == "g"


# --- Java client settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "words"),
    [
        ("key.deserializer", "Kafka option 'key.deserializer' is not supported as keys are deserialized"),
        ("value.deserializer", "Kafka option 'value.deserializer' is not supported as values"),
        ("key.serializer", "Kafka option 'key.serializer' is not supported as keys are serialized"),
        ("value.serializer", "Kafka option 'value.serializer' is not supported"),
        ("enable.auto.commit", "Kafka option 'enable.auto.commit' is not supported"),
        ("interceptor.classes", "Kafka option 'interceptor.classes' is not supported"),
        ("auto.offset.reset", "Instead set the source option 'startingOffsets'"),
        ("enable.partition.eof", "the source sets it itself"),
        ("sasl.login.callback.handler.class", "kafka.sasl.oauthbearer.method=oidc"),
        ("sasl.login.refresh.window.factor", "is not a setting librdkafka knows"),
    ],
)
def test_java_settings_spark_refuses_are_refused_with_its_words(prop: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(**{f"kafka.{prop}": "x"})
    assert f"kafka.{prop}" in str(info.value)
    assert words in str(info.value)


def test_jaas_plain_and_scram_become_librdkafka_credentials_and_stay_secret() -> None:
    jaas = (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="svc" '
        'password="p@ss w\\"rd";'
    )
    opts = parse(**{"kafka.sasl.jaas.config": jaas, "kafka.security.protocol": "SASL_PLAINTEXT"})
    assert opts.kafka_config == {
        "sasl.username": "svc",
        "sasl.password": 'p@ss w"rd',
        "sasl.mechanism": "PLAIN",
        "security.protocol": "SASL_PLAINTEXT",
    }
    assert "p@ss" not in repr(opts)
    scram = jaas.replace("plain.PlainLoginModule", "scram.ScramLoginModule")
    with pytest.raises(ConfigError, match=r"set kafka\.sasl\.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512"):
        parse(**{"kafka.sasl.jaas.config": scram})
    shaded = "kafkashaded." + scram  # Databricks' shaded class names
    config = parse(**{"kafka.sasl.jaas.config": shaded, "kafka.sasl.mechanism": "SCRAM-SHA-512"}).kafka_config
    assert (config["sasl.mechanism"], config["sasl.username"]) == ("SCRAM-SHA-512", "svc")
    for module, hint in [
        ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule", "oauthbearer.method=oidc"),
        ("com.sun.security.auth.module.Krb5LoginModule", "kafka.sasl.kerberos.keytab"),
        ("com.example.Custom", "no librdkafka equivalent"),
    ]:
        with pytest.raises(ConfigError, match=hint) as info:
            parse(**{"kafka.sasl.jaas.config": f'{module} required password="hunter2";'})
        assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match="content is not shown") as info:
        parse(**{"kafka.sasl.jaas.config": "password=hunter2"})
    assert "hunter2" not in str(info.value)


def _pem_certificate(path: Path) -> Path:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "statesnap-test-ca")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _jks(path: Path, pem: Path) -> Path:
    """A real JKS truststore made by keytool where it exists; else a file with JKS's magic."""
    try:
        subprocess.run(
            [
                "keytool",
                "-importcert",
                "-noprompt",
                "-alias",
                "ca",
                "-file",
                str(pem),
                "-keystore",
                str(path),
                "-storetype",
                "JKS",
                "-storepass",
                "changeit",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.CalledProcessError):
        path.write_bytes(b"\xfe\xed\xfe\xed" + b"\x00" * 60)
    return path


def test_truststores_pem_translates_jks_is_refused_with_what_to_write(tmp_path: Path) -> None:
    pem = _pem_certificate(tmp_path / "ca.pem")
    tls = {"kafka.security.protocol": "SSL", "kafka.ssl.truststore.password": "changeit"}
    opts = parse(**tls, **{"kafka.ssl.truststore.location": str(pem), "kafka.ssl.truststore.type": "PEM"})
    assert opts.kafka_config == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pem),
    }  # librdkafka loaded it

    jks = _jks(tmp_path / "trust.jks", pem)
    with pytest.raises(ConfigError) as info:
        parse(**tls, **{"kafka.ssl.truststore.location": str(jks)})
    text = str(info.value)
    for words in ("kafka.ssl.truststore.location", "JKS truststore", "keytool -list -rfc"):
        assert words in text
    assert "changeit" not in text
    assert "\n" not in text

    garbage = tmp_path / "bad.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    with pytest.raises(
        KafkaConfigError, match=r"option kafka\.ssl\.truststore\.location: librdkafka refuses it"
    ):
        parse(**tls, **{"kafka.ssl.truststore.location": str(garbage)})
    with pytest.raises(ConfigError, match=r"cannot read /nowhere/ca\.pem on the driver"):
        parse(**{"kafka.ssl.truststore.location": "/nowhere/ca.pem"})
    with pytest.raises(ConfigError, match=r"convert it .*-deststoretype PKCS12"):
        parse(**tls, **{"kafka.ssl.keystore.location": str(jks)})


def test_renamed_ignored_and_invalid_java_settings() -> None:
    config, origin = translate(
        {
            "fetch.max.wait.ms": "50",
            "max.poll.records": "500",
            "ssl.endpoint.identification.algorithm": "",
            "receive.buffer.bytes": "65536",
        }
    )
    assert config == {
        "fetch.wait.max.ms": "50",
        "ssl.endpoint.identification.algorithm": "none",
        "socket.receive.buffer.bytes": "65536",
    }
    assert origin["fetch.wait.max.ms"] == "fetch.max.wait.ms"
    assert parse(**{"kafka.fetch.max.wait.ms": "50"}).kafka_config == {"fetch.wait.max.ms": "50"}
    with pytest.raises(
        KafkaConfigError, match=r"option kafka\.security\.protocol: librdkafka refuses it"
    ) as info:
        parse(**{"kafka.security.protocol": "bogus"})
    assert info.value.property == "security.protocol"


def test_secret_kafka_config_is_merged_and_translated() -> None:
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" password="hunter2";'
    opts = parse(
        streaming=True,
        **{
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafkaConfig.secret": json.dumps({"sasl.jaas.config": jaas}),
        },
    )
    assert opts.kafka_config["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(opts)


# --- planning against a precise fake ------------------------------------------------------------


class FakeCluster:
    """What a Kafka cluster answers, from a model: per partition a log start and the timestamp of
    every record from offset 0 (records below the log start were deleted by retention)."""

    def __init__(
        self, opts: KafkaSourceOptions, logs: Mapping[TP, Sequence[int]], starts: Mapping[TP, int] = {}
    ):
        self.opts = opts
        self.logs = dict(logs)
        self.starts = dict(starts)

    def topic_partitions(self, *, missing_ok: bool = False) -> tuple[TP, ...]:
        sub = self.opts.strategy
        if sub.kind == "assign":
            return tuple(tp for tp in sub.assigned if tp in self.logs)
        return tuple(tp for tp in sorted(self.logs) if sub.matches(tp[0]))

    def earliest_of(self, tps: Sequence[TP]) -> dict[TP, int]:
        return {tp: self.starts.get(tp, 0) for tp in tps}

    def latest_of(self, tps: Sequence[TP]) -> dict[TP, int]:
        return {tp: len(self.logs[tp]) for tp in tps}

    def offsets_for_times(self, wanted: Mapping[TP, int]) -> dict[TP, int | None]:
        out: dict[TP, int | None] = {}
        for tp, ts in wanted.items():
            offsets = range(self.starts.get(tp, 0), len(self.logs[tp]))
            out[tp] = next((o for o in offsets if self.logs[tp][o] >= ts), None)
        return out


LOGS = {("a", 0): [100, 200, 300, 400], ("a", 1): [150, 250], ("b", 0): [500, 600, 700]}


def test_timestamps_map_to_the_first_offset_at_or_after_them() -> None:
    opts = parse(subscribe="a,b", startingTimestamp="250", endingTimestamp="650")
    # a[0]: 300 is the first at/after 250 → 2; a[1]: 250 → 1; b[0]: 500 → 0. Ends: a has nothing
    # at/after 650 → latest; b[0]: 700 → 2.
    assert plan_batch(opts, FakeCluster(opts, LOGS)) == {("a", 0): (2, 4), ("a", 1): (1, 2), ("b", 0): (0, 2)}

    per = parse(subscribe="a,b", startingOffsetsByTimestamp='{"a":{"0":201}}')
    assert plan_batch(per, FakeCluster(per, LOGS)) == {("a", 0): (2, 4), ("a", 1): (0, 2), ("b", 0): (0, 3)}

    late = parse(subscribe="a", startingTimestamp="999")
    with pytest.raises(ConfigError, match=r"no record of a\[0\] has a timestamp at or after 999"):
        plan_batch(late, FakeCluster(late, LOGS))
    latest = parse(subscribe="a", startingTimestamp="999", startingOffsetsByTimestampStrategy="latest")
    assert plan_batch(latest, FakeCluster(latest, LOGS)) == {("a", 0): (4, 4), ("a", 1): (2, 2)}
    stream = parse(streaming=True, subscribePattern="a|b", startingTimestamp="200")
    assert initial_offsets(stream, FakeCluster(stream, LOGS)) == {("a", 0): 1, ("a", 1): 1, ("b", 0): 0}


def test_json_offsets_and_data_loss_at_the_start() -> None:
    opts = parse(assign='{"a":[0],"b":[0]}', startingOffsets='{"a":{"0":1},"b":{"0":-2}}')
    assert plan_batch(opts, FakeCluster(opts, LOGS)) == {("a", 0): (1, 4), ("b", 0): (0, 3)}
    beyond = parse(subscribe="a", startingOffsets='{"a":{"0":9}}')
    with pytest.raises(ConfigError, match="beyond the end"):
        plan_batch(beyond, FakeCluster(beyond, LOGS))
    missing = parse(subscribe="a", startingOffsets='{"a":{"7":1}}')
    with pytest.raises(ConfigError, match=r"a\[7\] do not exist"):
        plan_batch(missing, FakeCluster(missing, LOGS))
    # Retention deleted a[0] below offset 3: asking for offset 1 is data loss.
    deleted = parse(subscribe="a", startingOffsets='{"a":{"0":1}}')
    with pytest.raises(DataLossError, match="failOnDataLoss=true"):
        plan_batch(deleted, FakeCluster(deleted, LOGS, {("a", 0): 3}))
    lenient = parse(subscribe="a", startingOffsets='{"a":{"0":1}}', failOnDataLoss="false")
    assert plan_batch(lenient, FakeCluster(lenient, LOGS, {("a", 0): 3}))[("a", 0)] == (3, 4)


def test_continue_from_detects_recreated_topics_gone_and_new_partitions() -> None:
    tps = [("a", 0), ("a", 1)]
    earliest, latest = {("a", 0): 0, ("a", 1): 0}, {("a", 0): 5, ("a", 1): 7}
    assert continue_from({("a", 0): 5}, tps, earliest, latest, fail_on_data_loss=True) == {
        ("a", 0): 5,
        ("a", 1): 0,
    }
    # The query stood at 4672, the recreated partition ends at 5: Spark fails the query.
    with pytest.raises(DataLossError, match=r"a\[0\].*4672.*ends at 5.*recreated"):
        continue_from({("a", 0): 4672, ("a", 1): 0}, tps, earliest, latest, fail_on_data_loss=True)
    resumed = continue_from({("a", 0): 4672, ("a", 1): 3}, tps, earliest, latest, fail_on_data_loss=False)
    assert resumed == {("a", 0): 0, ("a", 1): 3}  # from the earliest available offset, not 4672
    with pytest.raises(DataLossError, match=r"b\[0\] are gone"):
        continue_from({("a", 0): 1, ("a", 1): 1, ("b", 0): 3}, tps, earliest, latest, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match=r"offsets 1..3 were deleted"):
        continue_from(
            {("a", 0): 1, ("a", 1): 1}, tps, {("a", 0): 4, ("a", 1): 0}, latest, fail_on_data_loss=True
        )
    with pytest.raises(DataLossError, match="starts at offset 2 instead of 0"):
        continue_from({("a", 0): 1}, tps, {("a", 0): 0, ("a", 1): 2}, latest, fail_on_data_loss=True)


def test_rate_limit_trigger_gate_offsets_json_and_splits() -> None:
    assert rate_limit({("a", 0): 0, ("b", 0): 0}, {("a", 0): 300, ("b", 0): 100}, 100) == {
        ("a", 0): 75,
        ("b", 0): 25,
    }
    now = [0.0]
    gate = TriggerGate(min_offsets=10, max_delay_ms=5000, clock=lambda: now[0])
    assert not gate.allows(4)
    now[0] = 4.9
    assert not gate.allows(9)
    assert gate.allows(10)  # enough: fires, and the delay restarts
    now[0] = 9.8
    assert not gate.allows(3)
    assert not gate.allows(0)
    now[0] = 9.91
    assert gate.allows(3)  # 5 s since the last batch: fires with what there is
    assert encode_offsets({("b", 1): 4, ("a", 10): 2, ("a", 9): 1}) == {"a": {"9": 1, "10": 2}, "b": {"1": 4}}
    assert decode_offsets({"a": {"9": 1}}, "x") == {("a", 9): 1}
    assert decode_offsets({"0": 5, "1": 6}, "t") == {("t", 0): 5, ("t", 1): 6}  # earlier versions' offsets
    assert split_ranges({("a", 0): (0, 10), ("b", 0): (0, 1)}, min_partitions=3, max_records=None) == [
        (("a", 0), 0, 5),
        (("a", 0), 5, 10),
        (("b", 0), 0, 1),
    ]


def test_stream_reader_resets_recreated_partitions_and_rechecks_rerun_batches() -> None:
    """The streaming reader's plan against the fake: a recreated partition restarts at its earliest
    offset under ``failOnDataLoss=false``; a batch re-run after a restart (planned by an earlier
    process) is checked against the log before any task would wait for records that are gone."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from statesnap.spark.source import KafkaStreamReader

    lenient = KafkaStreamReader(parse(streaming=True, subscribe="a", failOnDataLoss="false"))
    lenient._oracle = FakeCluster(lenient.opts, LOGS)  # type: ignore[assignment]
    start = {"a": {"0": 4672, "1": 1}}
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert end == {"a": {"0": 4, "1": 2}}
    planned = [(p.topic, p.partition, p.start, p.end) for p in lenient.partitions(start, end)]  # type: ignore[attr-defined]
    assert planned == [("a", 0, 0, 4), ("a", 1, 1, 2)]

    strict = KafkaStreamReader(parse(streaming=True, subscribe="a"))
    strict._oracle = FakeCluster(strict.opts, LOGS)  # type: ignore[assignment]
    with pytest.raises(DataLossError, match=r"re-run reads up to offset 90 but the partition ends at 4"):
        strict.partitions({"a": {"0": 10, "1": 0}}, {"a": {"0": 90, "1": 2}})
    with pytest.raises(DataLossError, match="recreated"):
        strict.latestOffset(start, ReadAllAvailable())
    assert strict.latestOffset({"0": 1, "1": 0}, ReadAllAvailable()) == {"a": {"0": 4, "1": 2}}  # old format
