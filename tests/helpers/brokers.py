"""One harness per broker for the contract suite: how to point a connector at the broker, how
to make it refuse a collection, and how to read back everything it stored, in its order.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

import boto3
import nats
import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from nats.js.api import ConsumerConfig, DeliverPolicy

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from devkit.embedded import EmbeddedKafka, EmbeddedNats, EmbeddedSqs
from tests.helpers.capture import wait_for
from tests.helpers.receiver import Hook, Receiver

_ns = itertools.count()


@dataclass(frozen=True)
class Delivered:
    key: str  # the idempotency key the broker got with the message
    payload: dict[str, Any]
    raw: bytes = b""  # the payload's bytes, where the harness has them
    subject: str = ""  # the NATS subject it was stored under
    at: float = 0.0  # when the broker stored it (epoch seconds), where the harness has it

    @property
    def group(self) -> tuple[str, str, str | None]:
        m = self.payload["metadata"]
        return (m["sync_id"], m["collection_id"], m["record_id"])

    @property
    def seq(self) -> int:
        return int(self.payload["metadata"]["seq"])


class Harness(Protocol):
    kind: str
    too_large: str  # what the failed list's error says of a message over the size limit
    replays: bool  # no read-back: after a restart what came after the cursor may come again

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        """A connector config with a destination of its own."""

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        """Create the destination. ``only``: collections it takes (others are refused, and
        retried); ``dedupe=False``: a duplicate window too short to hide a resend, where the
        broker has one to set.
        """

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        """Everything the destination holds, each record's messages in their order."""

    def consume(self, connector: dict[str, Any]) -> list[Delivered]:
        """What a consumer of the destination receives."""

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        """After ``prepare``: messages over ``nbytes`` can never be taken."""


class NatsHarness:
    kind = "nats"
    replays = False
    too_large = "10054"  # JetStream: message size exceeds maximum allowed

    def __init__(self, server: EmbeddedNats, auth: dict[str, str] | None = None) -> None:
        self.server = server
        self.auth = auth or {}  # nats-py connect() arguments, e.g. user and password

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        """A connector config on a namespace (and streams) of its own."""
        ns = f"t{next(_ns)}"
        prefix = f"sequin-{stream}.{ns}"
        limits = {"name": f"{name}-{ns}".upper(), "subjects": [f"{prefix}.>"]}
        key = "records_stream" if stream == "records" else "events_stream"
        nats_cfg = {"url": self.server.url, "namespace": ns, key: limits, **self.auth}
        return {"name": name, "type": "nats", "stream": stream, "nats": nats_cfg, **extra}

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        """Create the destination. ``only``: collections it takes (others are refused);
        ``dedupe=False``: a duplicate window too short to hide a resend.
        """
        nats_cfg = connector["nats"]
        key = "records_stream" if connector["stream"] == "records" else "events_stream"
        limits = dict(nats_cfg[key], max_msgs_per_subject=-1)
        if only is not None:
            prefix = limits["subjects"][0][:-2]
            limits["subjects"] = [f"{prefix}.*.*.{c}.>" for c in only]
        if not dedupe:
            limits["duplicate_window"] = "100ms"
        nats_cfg[key] = limits
        cfg = NatsConnector.model_validate(connector)
        asyncio.run(ensure_streams(cfg))

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        """Each message with its ``Nats-Msg-Id``'s idempotency key: the id is the connector's
        namespace, ``:``, then the key (JetStream deduplicates per stream, across namespaces).
        """
        key = "records_stream" if connector["stream"] == "records" else "events_stream"
        stream = connector["nats"][key]["name"]
        namespace = connector["nats"].get("namespace", "default") + ":"
        got = asyncio.run(_read_stream(self.server.url, stream, self.auth))
        assert all(d.key.startswith(namespace) for d in got), "a Nats-Msg-Id without namespace"
        return [Delivered(d.key[len(namespace) :], d.payload, d.raw, d.subject, d.at)
                for d in got]  # fmt: skip

    consume = read

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        key = "records_stream" if connector["stream"] == "records" else "events_stream"

        async def update() -> None:
            nc = await nats.connect(self.server.url, **self.auth)
            js = nc.jetstream()
            info = await js.stream_info(connector["nats"][key]["name"])
            info.config.max_msg_size = nbytes
            await js.update_stream(info.config)
            await nc.close()

        asyncio.run(update())


class KafkaHarness:
    """Topics of 3 partitions; ``only`` makes the topic a template per collection and creates
    the topics of those collections alone, so that the others stay unknown to the broker.
    """

    kind = "kafka"
    replays = False
    too_large = "MSG_SIZE_TOO_LARGE"

    def __init__(self, server: EmbeddedKafka) -> None:
        self.server = server
        self.topics: dict[str, list[str]] = {}  # connector name -> the topics prepare made

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        topic = f"t{next(_ns)}-{name}"
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
                headers = dict(msg.headers() or [])
                value = msg.value()
                out.append(Delivered(headers["idempotency_key"].decode(), json.loads(value),
                                     value))  # fmt: skip
        assert not left, f"partitions never reached their end: {left}"
    finally:
        consumer.close()
    return out


class SqsHarness:
    """FIFO queues on moto's server; ``only`` makes the queue URL a template per collection and
    creates the queues of those collections alone. ``read`` looks at the queue in the
    server without consuming it (an SQS receiver would have to delete messages to see the
    next of a group, and moto then forgets their dedup ids).
    """

    kind = "sqs"
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
        sqs_cfg = {"queue_url": self.queue_url(f"t{next(_ns)}-{name}.fifo"),
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
            limit = {"MaximumMessageSize": str(nbytes)}
            self.client.set_queue_attributes(QueueUrl=self.queue_url(name), Attributes=limit)

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        out: list[Delivered] = []
        for name in self.queues[connector["name"]]:
            for m in self.server.peek(name):
                payload = orjson.loads(m["body"])
                key = payload["metadata"]["idempotency_key"]
                sent = hashlib.sha256(key.encode()).hexdigest()
                out.append(Delivered(key if m["dedup_id"] == sent else m["dedup_id"], payload))
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


class WebhookHarness:
    """Webhooks to a local receiver (tests/helpers/receiver.py), a path per connector."""

    kind = "webhook"
    too_large = "HTTP 413"
    replays = True

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def hook(self, connector: dict[str, Any]) -> Hook:
        return self.receiver.hooks[connector["webhook"]["url"].removeprefix(self.receiver.url)]

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        url = f"{self.receiver.url}/hooks/{name}-{next(_ns)}"
        hook = {"url": url, "secret": "hook-secret", "timeout": "2s"}
        return {"name": name, "type": "webhook", "stream": stream, "webhook": hook, **extra}

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        path = connector["webhook"]["url"].removeprefix(self.receiver.url)
        self.receiver.hooks[path] = Hook(secret=connector["webhook"]["secret"], only=only)

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        with self.receiver.lock:
            taken = list(self.hook(connector).taken)
        return [Delivered(m["metadata"]["idempotency_key"], m) for m in taken]

    consume = read

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        self.hook(connector).max_bytes = nbytes


HARNESSES: dict[str, tuple[Any, str]] = {  # harness class, its session server fixture
    "nats": (NatsHarness, "nats_server"),
    "kafka": (KafkaHarness, "kafka_server"),
    "sqs": (SqsHarness, "sqs_server"),
    "webhook": (WebhookHarness, "webhook_receiver"),
}


def wait_delivered(
    broker: Harness, connector: dict[str, Any], n: int, *, settle: float = 0.0
) -> list[Delivered]:
    """What the broker holds once it holds ``n`` messages of the connector; ``settle`` seconds
    later, so that anything more (a duplicate) would show.
    """
    got: list[Delivered] = []

    def enough() -> bool:
        got[:] = broker.read(connector)
        return len(got) >= n

    wait_for(enough, timeout=120, what=f"{n} messages at the broker")
    if settle:
        time.sleep(settle)
        got = broker.read(connector)
    return got


async def _read_stream(url: str, stream: str, auth: dict[str, str]) -> list[Delivered]:
    nc = await nats.connect(url, **auth)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out: list[Delivered] = []
        if info.state.messages == 0:
            return out
        sub = await js.subscribe(
            info.config.subjects[0],  # type: ignore[index]
            stream=stream,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        while True:
            msg = await sub.next_msg(timeout=5)
            key = (msg.headers or {}).get("Nats-Msg-Id", "")
            at = msg.metadata.timestamp.timestamp()
            out.append(Delivered(key, json.loads(msg.data), msg.data, msg.subject, at))
            if msg.metadata.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()
