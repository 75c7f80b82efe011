"""``weir demo``: capture a sample table from an embedded Postgres and show the messages.

Starts a throwaway PostgreSQL (``wal_level=logical``), creates ``public.users``, runs the capture
of a ``postgres`` source into the stream store, makes a few inserts, updates and deletes, and
prints each events-stream message with the NATS subject it is published under.
"""

from __future__ import annotations

import threading
import time

import orjson
import psycopg

from core.config import PostgresSource
from core.embedded import EmbeddedPostgres
from core.envelope import event_message, event_subject, group_key
from core.pg.capture import PostgresCapture
from core.store import Store

SAMPLE = [
    "CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL, plan text, "
    "updated_at timestamptz NOT NULL DEFAULT now())",
    "ALTER TABLE users REPLICA IDENTITY FULL",
    "INSERT INTO users (id, name, plan) VALUES (1, 'Paul', 'trial'), (2, 'Jessica', 'pro'), "
    "(3, 'Leto', 'trial')",
    "UPDATE users SET name = 'Muad''Dib', plan = 'pro' WHERE id = 1",
    "DELETE FROM users WHERE id = 3",
]


def run_demo() -> int:
    print("weir demo: starting an embedded PostgreSQL with wal_level=logical ...", flush=True)
    with EmbeddedPostgres() as pg:
        src = PostgresSource.model_validate(
            {"name": "demo-db", "kind": "postgres", "url": pg.url, "tables": ["public.users"]}
        )
        store = Store(pg.url)
        store.prepare([src])
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(SAMPLE[0])
            conn.execute(SAMPLE[1])
        capture = PostgresCapture(src, store)
        stop = threading.Event()
        worker = threading.Thread(target=capture.run, args=(stop,), daemon=True)
        worker.start()
        while capture.state != "streaming":
            if not worker.is_alive():
                print("weir demo: capture failed to start")
                return 1
            time.sleep(0.05)
        with psycopg.connect(pg.url, autocommit=True) as conn:
            for statement in SAMPLE[2:]:
                print(f"  sql> {statement}")
                conn.execute(statement)
        deadline = time.monotonic() + 10
        while capture.stored_changes < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        worker.join()
        print(f"\nweir demo: captured {capture.stored_changes} changes; the events stream:\n")
        sync_id = str(src.sync_id)
        with store.connect() as conn:
            rows = conn.execute(
                "SELECT seq, collection_id, record_id, action, commit_lsn, commit_idx, "
                "committed_at, record, changes FROM weir.events ORDER BY seq"
            ).fetchall()
        for row in rows:
            msg = event_message(sync_id, "postgres", *row)  # type: ignore[arg-type]
            key = group_key(sync_id, "postgres", str(row[1]), row[2])  # type: ignore[arg-type]
            print(event_subject("default", key, str(row[3])))
            print("  " + orjson.dumps(msg).decode() + "\n")
    return 0
