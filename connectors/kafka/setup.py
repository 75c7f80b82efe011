"""``weir kafka setup``: create the topic a connector produces to when it is missing, with
the partition count and replication factor of its config; report an existing one that differs.
"""

from __future__ import annotations

import asyncio
import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from connectors.kafka.config import KafkaConnector
from connectors.kafka.sink import _ClientLog, client_config
from core.failures import Unreachable

METADATA_TIMEOUT = 10.0  # seconds for the brokers to answer


class _SetupLog(_ClientLog):
    """librdkafka's lines at debug level (``-v``): a failed setup says why in its one line."""

    def log(self, level: int, fmt: str, facility: str, client: str, line: str) -> None:
        super().log(logging.DEBUG, fmt, facility, client, line)


def _ensure(connector: KafkaConnector) -> list[str]:
    s, name, topic = connector.kafka, connector.name, connector.topic
    if "{" in topic:
        return [f"{name}: topic template {topic!r}: its topics are created by the broker "
                "(auto_create_topics) or by you, one per placeholder value"]  # fmt: skip
    logs = _SetupLog(s)
    admin = AdminClient(client_config(s, name) | {"logger": logs})
    try:
        existing = admin.list_topics(timeout=METADATA_TIMEOUT).topics.get(topic)
    except KafkaException as e:
        admin.poll(0)  # serves the log lines librdkafka queued meanwhile
        reason = logs.failure or f"no answer within {METADATA_TIMEOUT:g}s ({e.args[0].str()})"
        raise Unreachable("Kafka", s.bootstrap_servers, reason, logs.check()[0]) from None
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
