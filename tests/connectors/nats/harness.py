"""The NATS kit's harness: a namespace and streams of its own per connector, read back from
JetStream with each message's ``Nats-Msg-Id``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from devkit.embedded import EmbeddedNats
from tests.helpers.brokers import Delivered, unique


class NatsHarness:
    kind = "nats"
    route_field = "subject"
    replays = False
    too_large = "10054"  # JetStream: message size exceeds maximum allowed

    def __init__(self, server: EmbeddedNats, auth: dict[str, str] | None = None) -> None:
        self.server = server
        self.auth = auth or {}  # nats-py connect() arguments, e.g. user and password

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        """A connector config on a namespace (and streams) of its own."""
        ns = unique()
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
        got = asyncio.run(read_stream(self.server.url, stream, self.auth))
        assert all(d.key.startswith(namespace) for d in got), "a Nats-Msg-Id without namespace"
        return [Delivered(d.key[len(namespace) :], d.payload, d.raw, d.subject, d.at, d.subject)
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


async def read_stream(url: str, stream: str, auth: dict[str, str]) -> list[Delivered]:
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
