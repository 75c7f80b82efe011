"""Fast batches (connectors/nats/fast.py) against the real server: whatever a batch holds and
the stream refuses, where, the outcome is the one of publishing each message with a PubAck of
its own: the same messages fail for the same reasons, the stream holds the same messages once,
and a batch sent again (after a crash) stores nothing twice."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.api import StreamConfig

from connectors.nats.config import NatsConnector
from connectors.nats.sink import NatsSink
from core.engine.sink import BatchError
from core.envelope import Message
from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness

LIMIT = 1000  # the streams' max_msg_size


def _message(seq: int, key: int, big: bool) -> Message:
    body = b'{"v":"%s"}' % (b"x" * (LIMIT if big else 10))
    group = f"s.postgres.public:t.{key}"
    return Message("s", "postgres", seq, "public:t", "insert", group, f"k{key}", body)


async def _publish(cfg: NatsConnector, batch: list[Message]) -> tuple[bool, dict[int, str]]:
    """Whether the sink sent fast batches, and the failed messages' errors by place. A core
    NATS subscriber of the subjects meanwhile receives the batch's messages, nothing else."""
    watcher = await nats.connect(cfg.nats.url)
    seen = await watcher.subscribe(f"sequin-events.{cfg.nats.namespace}.>")
    sink = NatsSink(cfg)
    await sink.connect()
    try:
        await sink.write_batch(batch)
        failed = {}
    except BatchError as e:
        failed = {i: f"{type(x).__name__}: {x}" for i, x in e.failed.items()}
    finally:
        await sink.close()
    await watcher.flush()
    got = []
    while seen.pending_msgs:
        got.append((await seen.next_msg(timeout=1)).data)
    await watcher.close()
    assert got and all(data in {m.payload for m in batch} for data in got), got[:3]
    return sink._fast is not None, failed


async def _stream(url: str, cfg: dict[str, Any], batched: bool) -> None:
    limits = cfg["nats"]["events_stream"]
    nc = await nats.connect(url)
    await nc.jetstream().add_stream(StreamConfig(
        name=limits["name"], subjects=limits["subjects"], max_msg_size=LIMIT,
        allow_batched=batched))  # fmt: skip
    await nc.close()


def test_a_fast_batch_ends_as_single_publishes_do(nats_server: EmbeddedNats) -> None:
    harness = NatsHarness(nats_server)

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=30))
    def case(spec: list[tuple[int, bool]]) -> None:
        batch = [_message(i + 1, key, big) for i, (key, big) in enumerate(spec)]
        got = {}
        for batched in (True, False):
            c = harness.connector("fast" if batched else "single", "events")
            asyncio.run(_stream(nats_server.url, c, batched))
            cfg = NatsConnector.model_validate(c)
            fast, failed = asyncio.run(_publish(cfg, batch))
            assert fast == batched
            again = asyncio.run(_publish(cfg, batch))[1]  # sent again: nothing new stored
            assert again == failed
            held = [d.key for d in harness.read(c)]
            assert len(held) == len(set(held)), "a message stored twice"
            got[batched] = (failed, sorted(held))
        assert got[True] == got[False]
        assert set(got[True][0]) == {i for i, (_, big) in enumerate(spec) if big}

    case()


def test_a_stream_that_stops_taking_fast_batches_is_published_to_singly(
    nats_server: EmbeddedNats,
) -> None:
    """``allow_batched`` turned off while the connector runs: the batch it refuses goes again
    at once, a message at a time, no attempt of its messages counted (one with ``max_attempts:
    1`` went to the failed list; found by an outside tryout), and nothing is lost or stored
    twice."""
    harness = NatsHarness(nats_server)
    c = harness.connector("off", "events")
    asyncio.run(_stream(nats_server.url, c, True))
    cfg = NatsConnector.model_validate(c)
    batch = [_message(i, i, False) for i in range(1, 7)]

    async def run() -> None:
        sink = NatsSink(cfg)
        await sink.connect()
        try:
            await sink.write_batch(batch[:3])
            nc = await nats.connect(nats_server.url)
            info = await nc.jetstream().stream_info(c["nats"]["events_stream"]["name"])
            info.config.allow_batched = False
            await nc.jetstream().update_stream(info.config)
            await nc.close()
            await sink.write_batch(batch[3:])  # refused as a fast batch: sent again singly
            assert sink._fast is None
        finally:
            await sink.close()

    asyncio.run(run())
    assert sorted(d.key for d in harness.read(c)) == sorted(m.key for m in batch)
