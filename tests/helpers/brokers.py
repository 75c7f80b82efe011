"""One harness per broker for the contract suite: how to point a connector at the broker, how
to make it refuse a collection, and how to read back everything it stored, in its order.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import nats
import orjson
from nats.js.api import ConsumerConfig, DeliverPolicy

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from core.embedded import EmbeddedNats
from tests.helpers.capture import wait_for

_ns = itertools.count()


@dataclass(frozen=True)
class Delivered:
    key: str  # the idempotency key the broker got with the message
    payload: dict[str, Any]

    @property
    def group(self) -> tuple[str, str, str | None]:
        m = self.payload["metadata"]
        return (m["sync_id"], m["collection_id"], m["record_id"])

    @property
    def seq(self) -> int:
        return int(self.payload["metadata"]["seq"])


class NatsHarness:
    kind = "nats"

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
        key = "records_stream" if connector["stream"] == "records" else "events_stream"
        stream = connector["nats"][key]["name"]
        return asyncio.run(_read_stream(self.server.url, stream, self.auth))


def wait_delivered(
    broker: NatsHarness, connector: dict[str, Any], n: int, *, settle: float = 0.0
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
            out.append(Delivered(key, orjson.loads(msg.data)))
            if msg.metadata.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()
