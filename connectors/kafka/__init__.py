"""Kafka: produces to a topic (or a topic template) keyed by the group key; ``weir kafka setup``
creates the topic."""

from connectors.kafka.config import KafkaConnector
from core.registry import ConnectorSpec

CONNECTOR = ConnectorSpec(
    config=KafkaConnector,
    sink="connectors.kafka.sink:make_sink",
    setup="connectors.kafka.setup:ensure_topics",
    setup_help="create the topics the connectors produce to",
)
