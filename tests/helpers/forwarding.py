"""Runs the forwarding engine against an in-memory store and broker (tests/helpers/fake_store.py,
fake_sink.py), for the engine's unit tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from unittest.mock import patch

from core.config.connector import BatchPolicy, ConnectorBase, RetryPolicy
from core.engine import session
from core.engine.forwarder import Forwarder
from tests.helpers.fake_sink import FakeBroker
from tests.helpers.fake_store import FakeStore


def connector(
    stream: str = "events",
    *,
    max_messages: int = 500,
    max_in_flight: int = 8,
    max_attempts: int | None = None,
    backoff: float = 0.001,
) -> ConnectorBase:
    """A connector config with a constant backoff of ``backoff`` seconds, without jitter."""
    retry = RetryPolicy(initial=timedelta(seconds=backoff), max=timedelta(seconds=backoff),
                        multiplier=1.0, jitter=0.0, max_attempts=max_attempts)  # fmt: skip
    return ConnectorBase(type="fake", name="c", stream=stream,
                         batch=BatchPolicy(max_messages=max_messages), retry=retry,
                         max_in_flight=max_in_flight)  # fmt: skip


def unsafe_saves(store: FakeStore, broker: FakeBroker) -> list[str]:
    """Watch every cursor save (flush, then commit): each message from the cursor's start
    position up to the saved seq must be on the broker or the failed list, or (records stream)
    superseded by a newer version of its record. Returns the list of violations, which grows
    as they happen."""
    violations: list[str] = []

    def check(sync_id: str, seq: int, state: dict[str, Any]) -> None:
        stored = set(broker.stored_keys())
        rows = store.rows[sync_id]
        for m in rows[store.starts.get(sync_id, 0) : seq]:
            if m.key in stored or (sync_id, m.seq) in store.failed:
                continue
            if store.stream == "records" and any(n.group == m.group for n in rows[m.seq :]):
                continue
            violations.append(f"cursor saved at {seq} before seq {m.seq} was durable")

    store.on_save = check
    return violations


async def forward(
    cfg: ConnectorBase,
    store: FakeStore,
    broker: FakeBroker,
    during: Callable[[], Awaitable[None]] | None = None,
    timeout: float = 10.0,
    blind: bool = False,
) -> Forwarder:
    """Run the engine until every source's saved cursor reached its head (after ``during``,
    if given, returned), then stop it as SIGTERM does and return it. Cursor saves are made
    every 2 ms instead of every 100 ms, so that a test waits less. ``blind``: a sink that cannot
    read the broker back."""
    open_sink = broker.blind_sink if blind else broker.sink
    fw = Forwarder(cfg, store.sources, None, store, open_sink=open_sink, open_reader=store.reader)
    stop = asyncio.Event()
    with patch.object(session, "SAVE_EVERY", 0.002):
        task = asyncio.create_task(fw.run(stop))
        try:
            async with asyncio.timeout(timeout):
                if during is not None:
                    await during()
                while not task.done() and not caught_up(store):
                    await asyncio.sleep(0.001)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
    return fw


def caught_up(store: FakeStore) -> bool:
    return all(store.cursor(i) == len(store.rows[sid]) for i, sid in enumerate(store.sync_ids))


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (the caller bounds the wait)."""
    while not condition():
        await asyncio.sleep(0.001)
