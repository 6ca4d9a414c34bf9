"""Schema-registry serdes (Avro, JSON Schema, Protobuf) against a schema-registry HTTP endpoint
and the real broker.

No schema-registry server can run here: Confluent Schema Registry and Karapace are not on PyPI
(Karapace installs from source only), and the Tansu broker validates against local schema files
but serves no registry REST API. So this file carries a small, faithful in-repo server,
:class:`RegistryServer`: real HTTP on loopback, implementing the subset of the Confluent Schema
Registry REST API that confluent-kafka's serializers and deserializers call, with its JSON shapes
and error codes (``POST /subjects/{s}/versions``, ``POST /subjects/{s}`` lookup, ``GET
/schemas/ids/{id}``, ``GET /subjects/{s}/versions/{latest|n}``, ``GET /subjects``; 40401 subject
not found, 40403 schema not found, 401 without credentials). confluent-kafka's own client talks
to it over HTTP exactly as to the real registry; the producer side uses confluent-kafka's
serializers directly, never statesnap's, so the bytes on the topic are framed independently.
"""

from __future__ import annotations

import base64
import json
import pickle
import re
import threading
import uuid
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.message_factory import GetMessageClass

from statesnap import Table
from statesnap.errors import (
    ConfigError,
    DeserializationError,
    SchemaRegistryError,
    SerdeError,
    SerializationError,
)
from statesnap.serde import AvroSerde, JsonSchemaSerde, ProtobufSerde, SchemaRegistry, resolve_serde

pytestmark = pytest.mark.integration

PARTITIONS = 2

ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "test.statesnap",
        "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}],
    }
)
KEY_AVRO = json.dumps({"type": "string"})
ORDER_JSON_SCHEMA = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": {"id": {"type": "string"}, "qty": {"type": "integer"}},
        "required": ["id", "qty"],
        "additionalProperties": False,
    }
)


# --- the registry ------------------------------------------------------------------------------------


class RegistryServer:
    """An in-memory Confluent-compatible schema registry on a loopback port (see the module doc).

    Schema ids are global and reused when the same schema is registered under another subject;
    versions count per subject from 1, as the real registry does. With *credentials*
    (``user:password``) every request needs that HTTP basic auth, else 401.
    """

    def __init__(self, credentials: str | None = None) -> None:
        self.credentials = credentials
        self.schemas: list[dict[str, Any]] = []  # index = id - 1
        self.subjects: dict[str, list[int]] = {}  # subject -> ids by version
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="schema-registry", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> RegistryServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- the model ------------------------------------------------------------------------------

    @staticmethod
    def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return (
            a["schema"] == b["schema"]
            and a.get("schemaType", "AVRO") == b.get("schemaType", "AVRO")
            and (a.get("references") or []) == (b.get("references") or [])
        )

    def register(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            versions = self.subjects.setdefault(subject, [])
            for sid in versions:
                if self._same(self.schemas[sid - 1], body):
                    return {"id": sid}
            sid = next((i + 1 for i, s in enumerate(self.schemas) if self._same(s, body)), 0)
            if not sid:
                entry = {"schema": body["schema"], "schemaType": body.get("schemaType", "AVRO")}
                entry["references"] = body.get("references") or []
                self.schemas.append(entry)
                sid = len(self.schemas)
            versions.append(sid)
            return {"id": sid}

    def _version_doc(self, subject: str, version: int) -> dict[str, Any]:
        sid = self.subjects[subject][version - 1]
        doc = {"subject": subject, "version": version, "id": sid, **self.schemas[sid - 1]}
        if doc["schemaType"] == "AVRO":
            del doc["schemaType"]  # the real registry leaves the default type out
        return doc

    def _schema_doc(self, sid: int) -> dict[str, Any]:
        doc = dict(self.schemas[sid - 1])
        if doc["schemaType"] == "AVRO":
            del doc["schemaType"]
        return doc

    # --- HTTP -------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _error(self, status: int, code: int, message: str) -> None:
                self._send(status, {"error_code": code, "message": message})

            def _authorized(self) -> bool:
                if registry.credentials is None:
                    return True
                expected = "Basic " + base64.b64encode(registry.credentials.encode()).decode()
                if self.headers.get("Authorization") == expected:
                    return True
                self._error(401, 401, "Unauthorized")
                return False

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                doc: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
                return doc

            def do_GET(self) -> None:
                path = urlsplit(self.path).path
                registry.requests.append(("GET", path))
                if not self._authorized():
                    return None
                with registry.lock:
                    if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
                        sid = int(m[1])
                        if 1 <= sid <= len(registry.schemas):
                            return self._send(200, registry._schema_doc(sid))
                        return self._error(404, 40403, "Schema not found")
                    if path == "/subjects":
                        return self._send(200, sorted(registry.subjects))
                    if m := re.fullmatch(r"/subjects/([^/]+)/versions/(latest|\d+)", path):
                        subject = unquote(m[1])
                        versions = registry.subjects.get(subject)
                        if not versions:
                            return self._error(404, 40401, f"Subject '{subject}' not found.")
                        v = len(versions) if m[2] == "latest" else int(m[2])
                        if not 1 <= v <= len(versions):
                            return self._error(404, 40402, "Version not found.")
                        return self._send(200, registry._version_doc(subject, v))
                    if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                        versions = registry.subjects.get(unquote(m[1]))
                        if not versions:
                            return self._error(404, 40401, "Subject not found.")
                        return self._send(200, list(range(1, len(versions) + 1)))
                return self._error(404, 404, "HTTP 404 Not Found")

            def do_POST(self) -> None:
                path = urlsplit(self.path).path
                registry.requests.append(("POST", path))
                if not self._authorized():
                    return None
                body = self._body()
                if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                    return self._send(200, registry.register(unquote(m[1]), body))
                if m := re.fullmatch(r"/subjects/([^/]+)", path):
                    subject = unquote(m[1])
                    with registry.lock:
                        versions = registry.subjects.get(subject)
                        if not versions:
                            return self._error(404, 40401, f"Subject '{subject}' not found.")
                        for v, sid in enumerate(versions, 1):
                            if registry._same(registry.schemas[sid - 1], body):
                                return self._send(200, registry._version_doc(subject, v))
                    return self._error(404, 40403, "Schema not found")
                return self._error(404, 404, "HTTP 404 Not Found")

        return Handler


@pytest.fixture
def registry() -> Iterator[RegistryServer]:
    server = RegistryServer().start()
    yield server
    server.stop()


def partition_of(key: bytes) -> int:
    return zlib.crc32(key) % PARTITIONS


def producer_side(registry_url: str, **conf: Any) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": registry_url, **conf})


def order_message_class() -> Any:
    """A protobuf message class built from a descriptor, as protoc-generated code would define it."""
    fd = descriptor_pb2.FileDescriptorProto(name="order.proto", package="test.statesnap", syntax="proto3")
    msg = fd.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    msg.field.add(name="qty", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return GetMessageClass(pool.FindMessageTypeByName("test.statesnap.Order"))


# --- a table of Avro records on the real broker ------------------------------------------------------


def test_a_table_reads_avro_keys_and_values_framed_by_the_registry(
    kafka: Any, registry: RegistryServer
) -> None:
    """Records produced with confluent-kafka's AvroSerializer (auto-registering, as producers do)
    come back from ``Table.get`` as dicts, looked up by Avro-serialized keys; a value written with
    an evolved schema is read with its own writer schema; the table never registers anything."""
    topic = kafka.create_topic(f"sr-{uuid.uuid4().hex[:12]}", PARTITIONS)
    client = producer_side(registry.url)
    key_ser = AvroSerializer(client, KEY_AVRO)
    val_ser = AvroSerializer(client, ORDER_AVRO)
    kctx = SerializationContext(topic, MessageField.KEY)
    vctx = SerializationContext(topic, MessageField.VALUE)
    truth: dict[str, dict[str, Any]] = {}
    rows = []
    for i in range(300):
        order_id = f"o-{i % 40}"
        value = {"id": order_id, "qty": i}
        truth[order_id] = value
        key = key_ser(order_id, kctx)
        rows.append((partition_of(key), key, val_ser(value, vctx)))
    evolved = json.loads(ORDER_AVRO)
    evolved["fields"].append({"name": "note", "type": "string", "default": ""})
    key = key_ser("o-evolved", kctx)
    rows.append(
        (
            partition_of(key),
            key,
            AvroSerializer(client, json.dumps(evolved))({"id": "o-evolved", "qty": 1, "note": "v2"}, vctx),
        )
    )
    kafka.produce(topic, rows)
    registered = sorted(registry.subjects)
    assert registered == [f"{topic}-key", f"{topic}-value"]
    posts_before = [r for r in registry.requests if r[0] == "POST" and r[1].endswith("/versions")]

    table = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=None,
        background=False,
        key_serde=AvroSerde(registry.url, topic=topic, is_key=True, schema=KEY_AVRO),
        value_serde="avro",  # the registry from the client properties, as Kafka Streams takes it
        kafka_config={"schema.registry.url": registry.url},
    )
    try:
        table.start()
        assert len(table) == len(truth) + 1
        for order_id, value in truth.items():
            assert table.get(order_id) == value
        assert table.get("o-evolved") == {"id": "o-evolved", "qty": 1, "note": "v2"}
        assert table.get("o-missing") is None
        assert dict(table.items()) == {**truth, "o-evolved": {"id": "o-evolved", "qty": 1, "note": "v2"}}
    finally:
        table.close(checkpoint=False)
    posts_after = [r for r in registry.requests if r[0] == "POST" and r[1].endswith("/versions")]
    assert posts_after == posts_before, "a reading table must never register schemas"
    assert sorted(registry.subjects) == registered


def test_undecodable_values_raise_a_typed_error_with_the_cause(kafka: Any, registry: RegistryServer) -> None:
    """Bytes that are not registry-framed, or name a schema id the registry does not know, raise
    DeserializationError (a StatesnapError) from Table.get — never a bare library error."""
    topic = kafka.create_topic(f"sr-{uuid.uuid4().hex[:12]}", PARTITIONS)
    val_ser = AvroSerializer(producer_side(registry.url), ORDER_AVRO)
    good = val_ser({"id": "a", "qty": 1}, SerializationContext(topic, MessageField.VALUE))
    unknown_id = b"\x00\x00\x00\x03\xe7" + good[5:]  # schema id 999
    kafka.produce(
        topic,
        [
            (partition_of(b"good"), b"good", good),
            (partition_of(b"plain"), b"plain", b'{"id": "a"}'),
            (partition_of(b"ghost"), b"ghost", unknown_id),
            (partition_of(b"short"), b"short", good[:7]),
        ],
    )
    table = Table(
        topic,
        bootstrap_servers=kafka.bootstrap,
        checkpoints=None,
        background=False,
        value_serde=AvroSerde(registry.url, topic=topic),
    )
    try:
        table.start()
        assert table.get(b"good") == {"id": "a", "qty": 1}
        for key, why in ((b"plain", "magic byte"), (b"ghost", "40403"), (b"short", "AVRO value of topic")):
            with pytest.raises(DeserializationError, match=why) as caught:
                table.get(key)
            assert caught.value.__cause__ is not None
            assert isinstance(caught.value, SerdeError)
    finally:
        table.close(checkpoint=False)


# --- JSON Schema and Protobuf --------------------------------------------------------------------------


def test_json_schema_round_trip_and_validation(registry: RegistryServer) -> None:
    topic = f"js-{uuid.uuid4().hex[:8]}"
    client = producer_side(registry.url)
    produced = JSONSerializer(ORDER_JSON_SCHEMA, client)(
        {"id": "a", "qty": 2}, SerializationContext(topic, MessageField.VALUE)
    )
    serde = resolve_serde("json_schema", schema_registry={"url": registry.url}, topic=topic)
    assert isinstance(serde, JsonSchemaSerde)
    assert serde.deserialize(produced) == {"id": "a", "qty": 2}
    # Serializing with the subject's latest version gives the producer's exact bytes.
    assert serde.serialize({"id": "a", "qty": 2}) == produced
    with pytest.raises(SerializationError, match="not of type 'integer'"):
        serde.serialize({"id": "a", "qty": "two"})
    with pytest.raises(DeserializationError):
        serde.deserialize(b"\x00\x00\x00\x00\x01{not json")


def test_protobuf_round_trip(registry: RegistryServer) -> None:
    topic = f"pb-{uuid.uuid4().hex[:8]}"
    order = order_message_class()
    produced = ProtobufSerializer(order, producer_side(registry.url), {"use.deprecated.format": False})(
        order(id="a", qty=3), SerializationContext(topic, MessageField.VALUE)
    )
    serde = ProtobufSerde(registry.url, topic=topic, message_type=order)
    got = serde.deserialize(produced)
    assert (got.id, got.qty) == ("a", 3)
    assert serde.serialize(order(id="a", qty=3)) == produced
    with pytest.raises(DeserializationError):
        serde.deserialize(produced[:6] + b"\xff\xff\xff")
    with pytest.raises(ConfigError, match="message_type"):
        resolve_serde("protobuf", schema_registry=registry.url, topic=topic)
    with pytest.raises(ConfigError, match="message_type"):
        ProtobufSerde(registry.url, topic=topic, message_type=None)


# --- settings, credentials, failures ------------------------------------------------------------------


def test_credentials_reach_the_registry_and_never_an_error() -> None:
    server = RegistryServer(credentials="alice:s3cr3t-pw").start()
    try:
        topic = f"auth-{uuid.uuid4().hex[:8]}"
        produced = AvroSerializer(
            producer_side(server.url, **{"basic.auth.user.info": "alice:s3cr3t-pw"}), ORDER_AVRO
        )({"id": "a", "qty": 1}, SerializationContext(topic, MessageField.VALUE))
        good = SchemaRegistry(server.url, {"basic.auth.user.info": "alice:s3cr3t-pw"})
        assert "s3cr3t" not in repr(good)
        assert AvroSerde(good, topic=topic).deserialize(produced) == {"id": "a", "qty": 1}

        wrong = SchemaRegistry(server.url, {"basic.auth.user.info": "alice:wrong-pw", "max.retries": 0})
        with pytest.raises(SchemaRegistryError, match="401") as caught:
            AvroSerde(wrong, topic=topic).deserialize(produced)
        assert "wrong-pw" not in str(caught.value)
        in_url = server.url.replace("http://", "http://alice:wrong-pw@")
        with pytest.raises(SchemaRegistryError) as caught:
            AvroSerde(in_url, topic=topic).deserialize(produced)
        assert "wrong-pw" not in str(caught.value)
        assert "wrong-pw" not in repr(SchemaRegistry(in_url))
    finally:
        server.stop()


def test_an_unreachable_registry_is_a_typed_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    registry = SchemaRegistry(f"http://127.0.0.1:{port}", {"max.retries": 0, "timeout": 2})
    serde = AvroSerde(registry, topic="t")
    with pytest.raises(SchemaRegistryError, match=f"cannot reach schema registry http://127.0.0.1:{port}"):
        serde.deserialize(b"\x00\x00\x00\x00\x01\x02a\x02")


def test_bad_settings_are_config_errors() -> None:
    for bad in ("", "not a url", "ftp://host:1"):
        with pytest.raises(ConfigError):
            SchemaRegistry(bad)
    with pytest.raises(ConfigError, match="needs a schema registry"):
        resolve_serde("avro", topic="t")
    with pytest.raises(ConfigError, match="topic"):
        resolve_serde("avro", schema_registry="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="url"):
        SchemaRegistry.of({"basic.auth.user.info": "a:b"})
    with pytest.raises(ConfigError, match=r"no\.such\.setting"):
        AvroSerde(SchemaRegistry("http://127.0.0.1:1", {"no.such.setting": 1}), topic="t").deserialize(b"x")


def test_serdes_pickle_by_configuration(registry: RegistryServer) -> None:
    """Serdes travel (e.g. to Spark executors) as settings; the copy builds its own client."""
    topic = f"pk-{uuid.uuid4().hex[:8]}"
    produced = AvroSerializer(producer_side(registry.url), ORDER_AVRO)(
        {"id": "p", "qty": 5}, SerializationContext(topic, MessageField.VALUE)
    )
    serde = AvroSerde(registry.url, topic=topic)
    assert serde.deserialize(produced) == {"id": "p", "qty": 5}  # builds the live client
    copy = pickle.loads(pickle.dumps(serde))
    assert copy.deserialize(produced) == {"id": "p", "qty": 5}
    assert copy.subject == f"{topic}-value"
