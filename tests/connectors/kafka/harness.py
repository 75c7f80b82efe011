"""The Kafka kit's harness: topics of 3 partitions, read from start to end."""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from devkit.embedded import EmbeddedKafka
from tests.helpers.brokers import Delivered, unique


class KafkaHarness:
    """Topics of 3 partitions; ``only`` makes the topic a template per collection and creates
    the topics of those collections alone, so that the others stay unknown to the broker.
    """

    kind = "kafka"
    route_field = "key"
    replays = False
    too_large = "MSG_SIZE_TOO_LARGE"

    def __init__(self, server: EmbeddedKafka) -> None:
        self.server = server
        self.topics: dict[str, list[str]] = {}  # connector name -> the topics prepare made

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        topic = f"{unique()}-{name}"
        kafka_cfg = {"bootstrap_servers": self.server.bootstrap, "topic": topic, "linger": "1ms"}
        return {"name": name, "type": "kafka", "stream": stream, "kafka": kafka_cfg, **extra}

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        kafka_cfg = connector["kafka"]  # Kafka has no duplicate window: dedupe changes nothing
        topics = [kafka_cfg["topic"]]
        if only is not None:
            base = kafka_cfg["topic"]
            kafka_cfg["topic"] = base + ".{collection}"
            kafka_cfg["librdkafka"] = {"topic.metadata.propagation.max.ms": 300}
            topics = [f"{base}.{c.replace(':', '_')}" for c in only]
        admin = AdminClient({"bootstrap.servers": self.server.bootstrap})
        for f in admin.create_topics([NewTopic(t, num_partitions=3) for t in topics]).values():
            f.result(timeout=30)
        self.topics[connector["name"]] = topics

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        """The producer's limit: tansu does not enforce a topic's max.message.bytes."""
        connector["kafka"]["max_message_bytes"] = nbytes

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        conf = {"bootstrap.servers": self.server.bootstrap}
        return read_kafka(conf, self.topics[connector["name"]], 3)

    consume = read


def read_kafka(conf: dict[str, Any], topics: list[str], partitions: int) -> list[Delivered]:
    """Every message of the topics' partitions, from the start to the end, with client ``conf``."""
    tps = [TopicPartition(t, p, 0) for t in topics for p in range(partitions)]
    consumer = Consumer(conf | {"group.id": "harness", "enable.partition.eof": True})
    out: list[Delivered] = []
    try:
        consumer.assign(tps)
        left = {(tp.topic, tp.partition) for tp in tps}
        deadline = time.monotonic() + 30
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.1):
                if (err := msg.error()) is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(err)
                    left.discard((msg.topic(), msg.partition()))
                    continue
                key, value = dict(msg.headers() or [])["idempotency_key"], msg.value()
                assert isinstance(key, bytes) and value is not None, msg
                where = (msg.key() or b"").decode()
                out.append(Delivered(key.decode(), json.loads(value), value, where=where))
        assert not left, f"partitions never reached their end: {left}"
    finally:
        consumer.close()
    return out
