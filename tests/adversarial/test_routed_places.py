"""A route step that picks the place itself (docs/transforms.md “Route”): a Kafka topic or an
SQS queue per tenant, filled into ``{route}`` of the connector's topic or queue URL. Each
change still reaches one place once, through SIGKILLs under load (the Kafka read-back covers
every topic the template matches), and a message whose route gives no place goes to the failed
list saying so."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from devkit.embedded import EmbeddedKafka, EmbeddedSqs
from tests.connectors.kafka.harness import KafkaHarness, read_kafka
from tests.connectors.sqs.harness import SqsHarness
from tests.helpers.capture import wait_for
from tests.helpers.functions import write_module
from tests.helpers.load import WeirProcess, create_load_table, load_with_interruptions
from tests.helpers.weir import cursor_of, failed_messages, insert_t, serving, weir_config

ACTIONS = ("insert", "update", "delete")


def test_kafka_topics_by_route_get_each_change_once_through_kills(
    kafka_server: EmbeddedKafka, db_url: str, tmp_path: Path
) -> None:
    """``topic: BASE.{route}`` and ``route: {topic: "{action}"}``: each action's changes in
    its own topic; two SIGKILLs under load, and every change is in exactly one topic, once."""
    create_load_table(db_url)
    broker = KafkaHarness(kafka_server)
    c = broker.connector("split", "events")
    base = c["kafka"]["topic"]
    c["kafka"]["topic"] = base + ".{route}"
    c["steps"] = [{"route": {"topic": "{action}"}}]
    topics = {a: f"{base}.{a}" for a in ACTIONS}
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    for f in admin.create_topics([NewTopic(t, num_partitions=3) for t in topics.values()]).values():
        f.result(timeout=30)
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [c]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))
    with WeirProcess(config, tmp_path / "weir.log") as weir:
        expected = load_with_interruptions(db_url, 1500, [500, 1000], weir.kill_and_restart)
        wait_for(lambda: cursor_of(db_url, "split")[0] >= len(expected), timeout=90,
                 what="every change delivered")  # fmt: skip
        weir.stop()
    keys: list[str] = []
    for action, topic in topics.items():
        got = read_kafka({"bootstrap.servers": kafka_server.bootstrap}, [topic], 3)
        assert {d.payload["action"] for d in got} <= {action}, topic
        keys += [d.key for d in got]
    assert len(keys) == len(set(keys)) == len(expected)


def test_sqs_queue_by_route_and_a_route_that_gives_none(
    sqs_server: EmbeddedSqs, table: str, functions_dir: Path
) -> None:
    """``queue_url: …/BASE-{route}.fifo`` and a function route giving the queue from the
    record's body: a message the function gives no queue, or a queue name a queue cannot have,
    goes to the failed list saying so, and the others are sent, each to its queue."""
    write_module(functions_dir / "tenants.py",
                 "def queue(action, record, changes, metadata):\n"
                 "    body = record['body']\n"
                 "    return {} if body == 'none' else {'queue': body}\n")  # fmt: skip
    sqs = SqsHarness(sqs_server)
    c = sqs.connector("tenants", "events")
    base = c["sqs"]["queue_url"].rsplit("/", 1)[1].removesuffix(".fifo")
    c["sqs"]["queue_url"] = sqs.queue_url(base + "-{route}.fifo")
    c["steps"] = [{"route": {"function": "tenants:queue"}}]
    names = [f"{base}-acme.fifo", f"{base}-b_c.fifo"]
    for name in names:
        sqs.client.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 4), body="acme")
        insert_t(table, range(4, 6), body="b_c")
        insert_t(table, range(6, 7), body="none")
        insert_t(table, range(7, 8), body="b c")
        wait_for(lambda: cursor_of(table, "tenants")[0] == 7, what="all seven handled")
    sqs.queues["tenants"] = names[:1]
    assert sorted(d.payload["record"]["id"] for d in sqs.read(c)) == [1, 2, 3]
    sqs.queues["tenants"] = names[1:]
    assert sorted(d.payload["record"]["id"] for d in sqs.read(c)) == [4, 5]
    none, spaced = (e["error"] for e in failed_messages(table, "tenants"))
    assert "its route gives no queue for {route}" in none, none
    assert "'b c' holds ' ': a name here takes A-Za-z0-9_- only" in spaced, spaced
