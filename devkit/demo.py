"""``./dev demo``: stream a sample table from an embedded Postgres to an embedded NATS.

Starts a throwaway PostgreSQL (``wal_level=logical``) and nats-server (JetStream), creates
``public.users``, runs Weir with a ``postgres`` source and two NATS connectors (events and
records), makes a few inserts, updates and deletes, and prints every message as a NATS
subscriber of ``sequin-events.>`` and ``sequin-records.>`` receives it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import nats
import orjson
import psycopg
from nats.aio.msg import Msg

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from core.config.model import WeirConfig
from core.runtime.service import prepare, serve
from devkit.embedded import EmbeddedNats, EmbeddedPostgres

SAMPLE = [
    "INSERT INTO users (id, name, plan) VALUES (1, 'Paul', 'trial'), (2, 'Jessica', 'pro'), "
    "(3, 'Leto', 'trial')",
    "UPDATE users SET name = 'Muad''Dib', plan = 'pro' WHERE id = 1",
    "DELETE FROM users WHERE id = 3",
]
EVENTS = 5  # one per row changed
# What the records stream ends at, by record id: (name, deleted). A records subscriber may
# also see a version that was the latest for a moment (3 inserted, then deleted).
LATEST = {"1": ("Muad'Dib", False), "2": ("Jessica", False), "3": ("Leto", True)}


def run_demo() -> int:
    print("weir demo: starting an embedded PostgreSQL (wal_level=logical) and nats-server -js")
    with EmbeddedPostgres() as pg, EmbeddedNats() as ns:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL, plan text)")
            conn.execute("ALTER TABLE users REPLICA IDENTITY FULL")
        nats_cfg = {"url": ns.url}
        cfg = WeirConfig.model_validate(
            {
                "sources": [{"name": "demo-db", "kind": "postgres", "url": pg.url,
                             "tables": ["public.users"]}],
                "connectors": [
                    {"name": "events-to-nats", "type": "nats", "stream": "events",
                     "nats": nats_cfg},
                    {"name": "records-to-nats", "type": "nats", "stream": "records",
                     "nats": nats_cfg},
                ],
            }
        )  # fmt: skip
        prepare(cfg)  # the slot first: nothing written from here on is missed
        for c in cfg.connectors:
            assert isinstance(c, NatsConnector)
            print("  " + "\n  ".join(asyncio.run(ensure_streams(c))))
        stop = threading.Event()
        weir = threading.Thread(target=serve, args=(cfg, stop), daemon=True)
        weir.start()
        try:
            got = asyncio.run(_subscribe_and_write(ns.url, pg.url))
        finally:
            stop.set()
            weir.join(timeout=30)
    events, latest = _tally(got)
    print(f"weir demo: {len(got)} messages received over NATS: {events} events (expected "
          f"{EVENTS}); the records' latest versions {'as' if latest == LATEST else 'NOT as'} "
          "in the table")  # fmt: skip
    return 0 if (events, latest) == (EVENTS, LATEST) else 1


def _tally(received: list[tuple[str, bytes]]) -> tuple[int, dict[str, tuple[str, bool]]]:
    """(events received, the last version received of each record)."""
    events = 0
    latest: dict[str, tuple[str, bool]] = {}
    for subject, data in received:
        if subject.startswith("sequin-events."):
            events += 1
        else:
            msg = orjson.loads(data)
            meta = msg["metadata"]
            latest[meta["record_id"]] = (msg["record"]["name"], bool(meta.get("deleted")))
    return events, latest


async def _subscribe_and_write(nats_url: str, pg_url: str) -> list[tuple[str, bytes]]:
    """The subjects and payloads received while the sample statements run."""
    nc = await nats.connect(nats_url)
    received: list[tuple[str, bytes]] = []
    events_done = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        received.append((msg.subject, msg.data))
        if _tally(received) == (EVENTS, LATEST):
            events_done.set()

    await nc.subscribe("sequin-events.>", cb=on_msg)
    await nc.subscribe("sequin-records.>", cb=on_msg)
    await nc.flush()  # subscribed before anything is published
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in SAMPLE:
            print(f"  sql> {statement}")
            conn.execute(statement)
    deadline = time.monotonic() + 30
    while not events_done.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # anything unexpected would show up now
    await nc.close()
    print()
    for subject, data in received:
        print(subject)
        print("  " + orjson.dumps(orjson.loads(data)).decode() + "\n")
    return received


if __name__ == "__main__":
    sys.exit(run_demo())
