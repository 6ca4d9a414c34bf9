"""Real services on loopback for the demo, tests and benchmarks: the Tansu Kafka broker, an Apache
Kafka broker (Java; jars fetched by scripts/setup.sh) and a moto S3 server. Each starts on a free
port, is waited for until it answers, and stops on exit — or, on Linux, when the process that
started it dies, however it dies (see ``orphans``)."""

from statesnap.devstack.apache import ApacheKafkaBroker, ApacheKafkaUnavailableError
from statesnap.devstack.broker import EmbeddedBroker
from statesnap.devstack.s3 import EmbeddedS3

__all__ = ["ApacheKafkaBroker", "ApacheKafkaUnavailableError", "EmbeddedBroker", "EmbeddedS3"]
