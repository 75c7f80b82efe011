"""``weir kafka setup``: create the topic a connector produces to when it is missing, with
the partition count and replication factor of its config; report an existing one that differs.
"""

from __future__ import annotations

import asyncio

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from connectors.kafka.config import KafkaConnector
from connectors.kafka.sink import client_config


def _ensure(connector: KafkaConnector) -> list[str]:
    s, name, topic = connector.kafka, connector.name, connector.topic
    if "{" in topic:
        return [f"{name}: topic template {topic!r}: its topics are created by the broker "
                "(auto_create_topics) or by you, one per placeholder value"]  # fmt: skip
    admin = AdminClient(client_config(s, name))
    existing = admin.list_topics(timeout=10).topics.get(topic)
    if existing is None:
        new = NewTopic(topic, num_partitions=s.partitions, replication_factor=s.replication_factor)
        admin.create_topics([new])[topic].result(timeout=30)
        return [f"{name}: created topic {topic} ({s.partitions} partitions)"]
    have = len(existing.partitions)
    if have != s.partitions:
        return [f"{name}: topic {topic} exists but differs: {have} partitions, "
                f"config says {s.partitions}"]  # fmt: skip
    return [f"{name}: topic {topic} exists and matches"]


async def ensure_topics(connector: KafkaConnector) -> list[str]:
    """One line: created, matches, or how it differs. Raises when Kafka is unreachable."""
    return await asyncio.to_thread(_ensure, connector)
