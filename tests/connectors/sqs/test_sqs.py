"""SQS connector specifics: FIFO group and dedup ids, standard queues."""

from __future__ import annotations

import hashlib

import orjson

from devkit.embedded import EmbeddedSqs
from tests.connectors.sqs.harness import SqsHarness
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, insert_t, serving, weir_config


def test_sqs_fifo_group_and_dedup_ids(sqs_server: EmbeddedSqs, table: str) -> None:
    broker = SqsHarness(sqs_server)
    c = broker.connector("records", "records")
    broker.prepare(c)
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 4))
        wait_for(lambda: cursor_of(table, "records")[0] == 3, what="3 delivered")
    got = broker.client.receive_message(
        QueueUrl=c["sqs"]["queue_url"], MaxNumberOfMessages=10, WaitTimeSeconds=1,
        MessageSystemAttributeNames=["MessageGroupId", "MessageDeduplicationId"],
    )["Messages"]  # fmt: skip
    assert len(got) == 3
    for m in got:
        meta = orjson.loads(m["Body"])["metadata"]
        attrs = m["Attributes"]
        assert attrs["MessageGroupId"] == f"{meta['sync_id']}.postgres.public:t.{meta['record_id']}"
        key = meta["idempotency_key"]
        assert attrs["MessageDeduplicationId"] == hashlib.sha256(key.encode()).hexdigest()


def test_sqs_standard_queue(sqs_server: EmbeddedSqs, table: str) -> None:
    """A queue without .fifo: messages go without group or dedup ids, and arrive."""
    broker = SqsHarness(sqs_server)
    c = broker.connector("events", "events")
    url = c["sqs"]["queue_url"] = c["sqs"]["queue_url"].removesuffix(".fifo")
    broker.client.create_queue(QueueName=url.rsplit("/", 1)[1])
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 4))
        wait_for(lambda: cursor_of(table, "events")[0] == 3, what="3 delivered")
    assert sorted(d.seq for d in broker.consume(c)) == [1, 2, 3]
