"""Options shared by several commands, and the output conventions (human text or ``--json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from statesnap.kafka.config import KafkaSettings, config_from_env, parse_properties

F = TypeVar("F", bound=Callable[..., Any])


def bootstrap_option(f: F) -> F:
    return click.option(
        "--bootstrap-servers",
        "-b",
        required=True,
        envvar="STATESNAP_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap address(es), e.g. 127.0.0.1:9092. [env: STATESNAP_BOOTSTRAP_SERVERS]",
    )(f)


def topic_option(f: F) -> F:
    return click.option(
        "--topic",
        "-t",
        required=True,
        envvar="STATESNAP_TOPIC",
        help="The changelog topic. [env: STATESNAP_TOPIC]",
    )(f)


def table_option(required: bool = True) -> Callable[[F], F]:
    def deco(f: F) -> F:
        return click.option(
            "--table",
            required=required,
            envvar="STATESNAP_TABLE",
            help="Table name in the checkpoint store (default: the topic). [env: STATESNAP_TABLE]",
        )(f)

    return deco


def kafka_config_options(f: F) -> F:
    f = click.option(
        "--kafka-config",
        "kafka_pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help="librdkafka property (TLS, SASL, …); repeatable. Also STATESNAP_KAFKA_<KEY> env vars "
        "(STATESNAP_KAFKA_SASL_MECHANISM=PLAIN → sasl.mechanism).",
    )(f)
    return click.option(
        "--kafka-config-file",
        "kafka_files",
        multiple=True,
        type=click.Path(dir_okay=False),
        help="Java-style properties file of librdkafka settings; repeatable.",
    )(f)


def storage_options(f: F) -> F:
    return click.option(
        "--storage-option",
        "storage_pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help="Blob-store option such as endpoint_url, region, profile, sse; repeatable. "
        "Also accepted as URL query parameters.",
    )(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(f)


def kafka_settings(
    bootstrap_servers: str, pairs: tuple[str, ...], files: tuple[str, ...], timeout: float = 15.0
) -> KafkaSettings:
    """Environment first, then files, then explicit pairs: the most specific setting wins."""
    config: dict[str, str] = config_from_env()
    config.update(parse_properties(list(pairs), list(files)))
    return KafkaSettings(bootstrap_servers, config, timeout)


def pairs_to_dict(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=what)
        out[key] = value
    return out


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=None, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()
