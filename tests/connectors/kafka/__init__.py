"""The Kafka connector's test kit: an embedded Kafka-protocol broker (tansu); front.py puts TLS
and SASL in front of it."""

from devkit.embedded import EmbeddedKafka
from tests.connectors import Kit
from tests.connectors.kafka.harness import KafkaHarness

KIT = Kit(server=EmbeddedKafka, fixture="kafka_server", harness=KafkaHarness)
