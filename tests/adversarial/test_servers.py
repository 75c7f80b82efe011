"""Servers that go away under Weir: the source-and-store Postgres restarted mid-stream. Capture,
the connectors and the leases come back by themselves, and the subscriber gets every change
once, in order."""

from __future__ import annotations

import threading
import time

import psycopg

from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.helpers.brokers import NatsHarness, wait_delivered
from tests.helpers.weir import serving, weir_config


def test_postgres_restarted_under_load_loses_nothing(nats_server: EmbeddedNats) -> None:
    with EmbeddedPostgres(durable=True) as server:
        url = server.url
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        harness = NatsHarness(nats_server)
        events = harness.connector("events", "events")
        harness.prepare(events)
        stop = threading.Event()

        def load() -> None:  # one row a transaction, through the restart (bounded: 3000 rows)
            i = 0
            while not stop.is_set() and i < 3000:
                try:
                    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                        # A commit the server made as the connection broke: go on after it.
                        row = conn.execute("SELECT coalesce(max(id) + 1, 0) FROM t").fetchone()
                        i = int(row[0]) if row else 0
                        while not stop.is_set() and i < 3000:
                            conn.execute("INSERT INTO t VALUES (%s, 0)", (i,))
                            i += 1
                            time.sleep(0.002)
                except psycopg.OperationalError:
                    time.sleep(0.2)  # the server is down: try again

        with serving(weir_config(url, [events])):
            loader = threading.Thread(target=load, daemon=True)
            loader.start()
            time.sleep(2)
            server.stop()  # fast shutdown: Weir's connections, the loader's, all dropped
            time.sleep(3)
            server.start()
            loader.join(120)
            stop.set()
            with psycopg.connect(url) as conn:
                written = [r[0] for r in conn.execute("SELECT id FROM t ORDER BY id")]
            assert len(written) == 3000
            got = wait_delivered(harness, events, len(written), settle=1.0)
    ids = [d.payload["record"]["id"] for d in got]
    assert ids == written  # every committed row, once, in commit order
