"""Tables read while they change (seed job, backfills), and checks of the records stream
against them."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
import yaml

from tests.connectors.nats.harness import NatsHarness
from tests.helpers import stored
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.weir import serving, weir_config


def create_items(url: str, n: int) -> None:
    """``items (id, v, note)`` with ``n`` rows, and ``markers`` to see capture catch up."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL, note text)")
        conn.execute(
            "INSERT INTO items SELECT i, 0, 'row ' || i FROM generate_series(1, %s) i", (n,)
        )
        conn.execute("CREATE TABLE markers (id serial PRIMARY KEY)")


def write_config(path: Path, url: str, **source: Any) -> Path:
    spec = {"name": "app", "kind": "postgres", "url": url,
            "tables": ["public.items", "public.markers"], **source}  # fmt: skip
    path.write_text(yaml.safe_dump({"sources": [spec], "connectors": []}))
    return path


class Mutator:
    """Another connection that keeps updating, deleting and inserting rows of ``items`` in
    small transactions until the block ends (at most ``limit`` seconds)."""

    def __init__(self, url: str, n: int, limit: float = 300.0) -> None:
        self.url = url
        self.n = n
        self.limit = limit
        self.updates = self.deletes = self.inserts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        rnd = random.Random(7)
        deadline = time.monotonic() + self.limit
        next_id = self.n + 1
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._stop.is_set() and time.monotonic() < deadline:
                    ids = [rnd.randint(1, self.n) for _ in range(10)]
                    with conn.transaction():
                        cur = conn.execute(
                            "UPDATE items SET v = v + 1, note = 'changed ' || v WHERE id = ANY(%s)",
                            (ids,),
                        )
                        self.updates += cur.rowcount
                        cur = conn.execute(
                            "DELETE FROM items WHERE id = %s", (rnd.randint(1, self.n),)
                        )
                        self.deletes += cur.rowcount
                        if rnd.random() < 0.2:
                            conn.execute("INSERT INTO items VALUES (%s, 0, 'new')", (next_id,))
                            next_id += 1
                            self.inserts += 1
                    time.sleep(0.005)
        except BaseException as e:
            self.error = e

    def __enter__(self) -> Mutator:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None and t is None:
            raise self.error


def wait_captured(url: str) -> None:
    """Until capture has stored a change committed now (so every earlier one too)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("INSERT INTO markers DEFAULT VALUES RETURNING id").fetchone()
        assert row is not None
    marker = str(row[0])

    wait_for(lambda: stored.record(url, "public:markers", marker) is not None, timeout=120,
             what="capture to catch up")  # fmt: skip


def table_rows(url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        return {
            str(i): {"id": i, "v": v, "note": note}
            for i, v, note in conn.execute("SELECT id, v, note FROM items").fetchall()
        }


def assert_stream_equals_table(url: str) -> int:
    """The live records of ``items`` are the table's rows exactly; returns how many records
    (tombstones included) the stream holds for it."""
    table = table_rows(url)
    rows = [r for r in stored.records(url) if r["collection_id"] == "public:items"]
    live = {r["record_id"]: r["record"] for r in rows if not r["deleted"]}
    stale = [rid for rid in live if rid in table and live[rid] != table[rid]][:5]
    resurrected = [rid for rid in live if rid not in table][:5]
    missing = [rid for rid in table if rid not in live][:5]
    assert not stale, f"stale records: {[(r, live[r], table[r]) for r in stale]}"
    assert not resurrected, f"deleted rows live in the stream: {resurrected}"
    assert not missing, f"rows missing from the stream: {missing}"
    return len(rows)


def assert_nats_delivers_the_table(url: str, harness: NatsHarness, records: int) -> None:
    """A records connector from the beginning delivers each record once: the live ones are the
    table's rows, the others tombstones of rows the table no longer has."""
    connector = harness.connector("seeded", "records", start_position="beginning",
                                  collections=["public:items"])  # fmt: skip
    harness.prepare(connector)
    with serving(weir_config(url, [connector], tables=["public.items", "public.markers"])):
        got = wait_delivered(harness, connector, records, settle=0.5)
    table = table_rows(url)
    ids = [d.payload["metadata"]["record_id"] for d in got]
    assert len(ids) == len(set(ids)) == records
    live = {d.payload["metadata"]["record_id"]: d.payload["record"]
            for d in got if not d.payload["metadata"]["deleted"]}  # fmt: skip
    assert live == table
