"""Serdes: pure byte <-> object pairs; the table itself stores bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statesnap.errors import ConfigError, DeserializationError, SerializationError, StatesnapError
from statesnap.serde import (
    AvroSerde,
    BytesSerde,
    JsonSchemaSerde,
    JsonSerde,
    SchemaRegistry,
    Serde,
    StringSerde,
    resolve_serde,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)


@given(st.binary())
def test_bytes_round_trip(data: bytes) -> None:
    s = BytesSerde()
    assert s.deserialize(s.serialize(data)) == data


def test_bytes_accepts_buffers_and_rejects_text() -> None:
    s = BytesSerde()
    assert s.serialize(bytearray(b"ab")) == b"ab"
    assert s.serialize(memoryview(b"cd")) == b"cd"
    with pytest.raises(TypeError, match="str"):
        s.serialize("text")


@given(st.text())
def test_string_round_trip(text: str) -> None:
    s = StringSerde()
    assert s.deserialize(s.serialize(text)) == text


def test_string_other_encoding() -> None:
    s = StringSerde("latin-1")
    assert s.serialize("é") == b"\xe9"
    assert s.deserialize(b"\xe9") == "é"


@given(_json)
def test_json_round_trip(obj: object) -> None:
    s = JsonSerde()
    assert s.deserialize(s.serialize(obj)) == obj


@pytest.mark.parametrize("number", [-(2**63) - 1, 2**64, [2**70, {"n": -(2**65)}]])
def test_json_integers_past_64_bits_stay_integers(number: object) -> None:
    """orjson reads them as floats without a word (hypothesis found -9223372036854775809)."""
    s = JsonSerde()
    assert s.deserialize(s.serialize(number)) == number
    assert repr(s.deserialize(s.serialize(number))) == repr(number)


def test_the_string_serde_does_not_turn_none_into_text() -> None:
    """Kafka's null (no key, a tombstone) is no text: StringSerde made a null key the text key
    "None", one store row for both. (JSON's ``null`` is a document, so JsonSerde keeps it.)"""
    with pytest.raises(SerializationError, match="cannot encode None"):
        StringSerde().serialize(None)
    assert StringSerde().serialize("None") == b"None"


def test_json_is_canonical() -> None:
    """Equal objects must give equal bytes, or two writers would produce different tables."""
    s = JsonSerde()
    assert s.serialize({"b": 1, "a": [1, 2]}) == s.serialize({"a": [1, 2], "b": 1}) == b'{"a":[1,2],"b":1}'


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        (None, BytesSerde),
        ("bytes", BytesSerde),
        ("string", StringSerde),
        ("str", StringSerde),
        ("json", JsonSerde),
        ("JSON", JsonSerde),
    ],
)
def test_resolve_by_name(name: str | None, cls: type) -> None:
    assert isinstance(resolve_serde(name), cls)


def test_resolve_instances_and_custom_serdes() -> None:
    class Upper:
        def serialize(self, obj: object) -> bytes:
            return str(obj).upper().encode()

        def deserialize(self, data: bytes) -> object:
            return data.decode()

    custom = Upper()
    assert isinstance(custom, Serde)
    assert resolve_serde(custom) is custom
    j = JsonSerde()
    assert resolve_serde(j) is j


@pytest.mark.parametrize("bad", ["avro", "", 42, object()])
def test_unknown_serdes_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError):
        resolve_serde(bad)  # type: ignore[arg-type]


# --- decode errors are typed -------------------------------------------------------------------------


def test_undecodable_json_is_a_typed_error_with_the_cause_and_without_the_value() -> None:
    with pytest.raises(DeserializationError) as caught:
        JsonSerde().deserialize(b'{"card": "4111-1111", oops')
    err = caught.value
    assert isinstance(err, StatesnapError)
    assert isinstance(err, ValueError)  # code that caught json's ValueError still does
    assert isinstance(err.__cause__, json.JSONDecodeError)
    assert "4111" not in str(err), "values may hold secrets: never quoted in errors"
    with pytest.raises(DeserializationError, match="not valid JSON"):
        JsonSerde().deserialize(b"\xff\xfe")


def test_undecodable_text_is_a_typed_error() -> None:
    with pytest.raises(DeserializationError, match="utf-8") as caught:
        StringSerde().deserialize(b"ok\xffsecret")
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)
    assert "secret" not in str(caught.value)


def test_unencodable_json_is_a_typed_error() -> None:
    with pytest.raises(SerializationError, match="set"):
        JsonSerde().serialize({1, 2})


# --- schema-registry serdes by name (no I/O until first use) --------------------------------------


def test_registry_serdes_by_name() -> None:
    value = resolve_serde("avro", schema_registry="http://registry:8081", topic="orders")
    assert isinstance(value, AvroSerde)
    assert value.subject == "orders-value"
    key = resolve_serde("AVRO", schema_registry={"url": "http://registry:8081"}, topic="orders", is_key=True)
    assert isinstance(key, AvroSerde)
    assert key.subject == "orders-key"
    assert isinstance(resolve_serde("json_schema", schema_registry="http://r:1", topic="t"), JsonSchemaSerde)
    assert value.conf["auto.register.schemas"] is False, "a table reader never registers schemas"


def test_registry_settings_hide_secrets() -> None:
    reg = SchemaRegistry.of("https://bob:hunter2@registry:8081", {"basic.auth.user.info": "bob:pw-xyz"})
    shown = repr(reg) + repr(AvroSerde(reg, topic="t"))
    assert "hunter2" not in shown
    assert "pw-xyz" not in shown
    assert reg.safe_url == "https://***@registry:8081"
    with pytest.raises(ConfigError) as caught:
        SchemaRegistry("ftp://bob:hunter2@host")
    assert "hunter2" not in str(caught.value)
