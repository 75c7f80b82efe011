"""The SQS kit's harness: FIFO queues on moto's server."""

from __future__ import annotations

import hashlib
from typing import Any

import boto3
import orjson

from devkit.embedded import EmbeddedSqs
from tests.helpers.brokers import Delivered, unique


class SqsHarness:
    """FIFO queues on moto's server; ``only`` makes the queue URL a template per collection and
    creates the queues of those collections alone. ``read`` looks at the queue in the
    server without consuming it (an SQS receiver would have to delete messages to see the
    next of a group, and moto then forgets their dedup ids).
    """

    kind = "sqs"
    route_field = "group"
    replays = False
    too_large = "over the queue's MaximumMessageSize"

    def __init__(self, server: EmbeddedSqs) -> None:
        self.server = server
        self.client = boto3.client("sqs", region_name="us-east-1", endpoint_url=server.url,
                                   aws_access_key_id="k", aws_secret_access_key="s")  # fmt: skip
        self.queues: dict[str, list[str]] = {}  # connector name -> the queues prepare made

    def queue_url(self, name: str) -> str:
        return self.server.queue_url(name)

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        sqs_cfg = {"queue_url": self.queue_url(f"{unique()}-{name}.fifo"),
                   "endpoint_url": self.server.url, "access_key_id": "test",
                   "secret_access_key": "test"}  # fmt: skip
        return {"name": name, "type": "sqs", "stream": stream, "sqs": sqs_cfg, **extra}

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        """SQS's dedup window is 5 minutes and cannot be shortened: ``dedupe`` changes
        nothing, so a resend within the tests is always caught by the dedup id.
        """
        sqs_cfg = connector["sqs"]
        names = [sqs_cfg["queue_url"].rsplit("/", 1)[1]]
        if only is not None:
            base = names[0].removesuffix(".fifo")
            sqs_cfg["queue_url"] = self.queue_url(base + "-{collection}.fifo")
            names = [f"{base}-{c.replace(':', '_')}.fifo" for c in only]
        for name in names:
            self.client.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})
        self.queues[connector["name"]] = names

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        for name in self.queues[connector["name"]]:
            self.client.set_queue_attributes(
                QueueUrl=self.queue_url(name), Attributes={"MaximumMessageSize": str(nbytes)}
            )

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        out: list[Delivered] = []
        for name in self.queues[connector["name"]]:
            for m in self.server.peek(name):
                payload = orjson.loads(m["body"])
                key = payload["metadata"]["idempotency_key"]
                sent = hashlib.sha256(key.encode()).hexdigest()
                out.append(Delivered(key if m["dedup_id"] == sent else m["dedup_id"], payload,
                                     where=m["group_id"] or ""))  # fmt: skip
        return out

    def consume(self, connector: dict[str, Any]) -> list[Delivered]:
        """Receive and delete until the queue is empty, as a worker would (so that each
        group's next message comes).
        """
        url = connector["sqs"]["queue_url"]
        out: list[Delivered] = []
        while True:
            resp = self.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                               VisibilityTimeout=30, WaitTimeSeconds=1)  # fmt: skip
            msgs = resp.get("Messages", [])
            if not msgs:
                return out
            for m in msgs:
                payload = orjson.loads(m["Body"])
                out.append(Delivered(payload["metadata"]["idempotency_key"], payload))
            self.client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)
                ],
            )
