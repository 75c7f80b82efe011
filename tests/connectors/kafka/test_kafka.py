"""Kafka connector specifics: what a consumer gets (key, headers), `weir kafka setup`, topic
templates.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from pydantic import ValidationError

from connectors.kafka.config import KafkaConnector
from devkit.embedded import EmbeddedKafka
from tests.connectors.kafka.harness import KafkaHarness
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, insert_t, serving, weir_config


def test_kafka_key_headers_and_value(kafka_server: EmbeddedKafka, table: str) -> None:
    broker = KafkaHarness(kafka_server)
    c = broker.connector("events", "events")
    broker.prepare(c)
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 4))
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE t SET body = 'y' WHERE id = 2")
        wait_for(lambda: cursor_of(table, "events")[0] == 4, what="4 delivered")
    consumer = Consumer({"bootstrap.servers": kafka_server.bootstrap, "group.id": "check"})
    topic = c["kafka"]["topic"]
    consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got: list[Message] = []
    while len(got) < 4:
        for msg in consumer.consume(10, timeout=5):
            assert msg.error() is None
            got.append(msg)
    consumer.close()
    by_partition: dict[bytes, set[int | None]] = {}
    actions: list[str] = []
    for msg in got:
        key, value = msg.key(), msg.value()
        assert isinstance(key, bytes) and value is not None
        payload = orjson.loads(value)
        meta = payload["metadata"]
        actions.append(payload["action"])
        assert dict(msg.headers() or []) == {"idempotency_key": meta["idempotency_key"].encode(),
                                             "collection_id": b"public:t",
                                             "action": payload["action"].encode()}  # fmt: skip
        assert key.decode() == f"{meta['sync_id']}.postgres.public:t.{meta['record_id']}"
        by_partition.setdefault(key, set()).add(msg.partition())
    assert all(len(parts) == 1 for parts in by_partition.values()), "a record in two partitions"
    assert sorted(actions) == ["insert"] * 3 + ["update"]


def test_kafka_topic_template_per_collection(kafka_server: EmbeddedKafka, table: str) -> None:
    broker = KafkaHarness(kafka_server)
    c = broker.connector("events", "events")
    broker.prepare(c, only=["public:t"])  # the topic becomes {topic}.{collection}
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 4))
        wait_for(lambda: cursor_of(table, "events")[0] == 3, what="3 delivered")
    got = broker.read(c)
    assert len(got) == 3
    with pytest.raises(ValidationError, match=r"unknown placeholder \{table\}"):
        KafkaConnector.model_validate({"name": "x", "type": "kafka", "stream": "events",
                                       "kafka": {"topic": "weir.{table}"}})  # fmt: skip


def test_kafka_setup_creates_then_reports_differences(
    kafka_server: EmbeddedKafka, tmp_path: Path
) -> None:
    config = tmp_path / "weir.yaml"
    config.write_text(
        "store: {url: postgresql://unused@127.0.0.1/x}\n"
        "connectors:\n"
        "  - {name: evs, type: kafka, stream: events,\n"
        f"     kafka: {{bootstrap_servers: '{kafka_server.bootstrap}', topic: setup-events,"
        " partitions: 4}}\n"
    )

    def setup() -> str:
        cmd = [sys.executable, "-m", "core.cli", "kafka", "setup", "--config", str(config)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert setup() == "evs: created topic setup-events (4 partitions)"
    assert setup() == "evs: topic setup-events exists and matches"
    config.write_text(config.read_text().replace("partitions: 4", "partitions: 8"))
    assert setup() == "evs: topic setup-events exists but differs: 4 partitions, config says 8"
