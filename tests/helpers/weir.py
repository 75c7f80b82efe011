"""Running Weir (sources and connectors) in a thread of the test process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg

from core.config.model import WeirConfig
from core.runtime.service import prepare, serve
from tests.helpers import stored


def weir_config(
    db_url: str,
    connectors: list[dict[str, Any]],
    store: dict[str, Any] | None = None,
    **source: Any,
) -> WeirConfig:
    spec: dict[str, Any] = {"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}
    spec.update(source)
    top = {"sources": [spec], "connectors": connectors}
    return WeirConfig.model_validate(top if store is None else {**top, "store": store})


@contextmanager
def serving(cfg: WeirConfig, first: bool = True) -> Iterator[None]:
    """``weir run`` in a thread; on exit it drains, and must exit 0. The slots are made first
    (unless another instance is ``first``), so every change from here on is captured whenever
    the capture thread gets going.
    """
    if first:
        prepare(cfg)
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(serve(cfg, stop)), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive(), "weir did not stop within 60s"
    assert result == [0], f"weir exited with {result}"


class Running:
    """``weir run`` in a thread, for a test that expects it to stop by itself."""

    def __init__(self, cfg: WeirConfig) -> None:
        self.result: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=lambda: self.result.append(serve(cfg, self.stop)), daemon=True
        )
        self.thread.start()

    def exit_status(self, timeout: float = 60) -> int:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join(60)
            raise AssertionError(f"weir run did not stop by itself within {timeout}s")
        return self.result[0]


def store_events(url: str) -> list[tuple[int, str, str | None, str]]:
    """(seq, collection_id, record_id, action) of the events stream, in seq order."""
    return [(e["seq"], e["collection_id"], e["record_id"], e["action"]) for e in stored.events(url)]


def cursor_of(url: str, connector: str) -> tuple[int, Any]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT seq, broker_state FROM weir.cursors WHERE connector = %s", (connector,)
        ).fetchone()
    return (int(row[0]), row[1]) if row is not None else (-1, None)  # -1: not started yet


def failed_messages(url: str, connector: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT * FROM weir.failed_messages WHERE connector = %s ORDER BY seq", (connector,)
        ).fetchall()


def insert_t(url: str, ids: range, body: str = "x") -> None:
    """Rows of the ``t (id, body)`` table the ``table`` fixture makes."""
    with psycopg.connect(url, autocommit=True) as conn:
        for i in ids:
            conn.execute("INSERT INTO t VALUES (%s, %s)", (i, body))


RETAINED = {"events_retention": "7d"}  # the store settings of captured_then_pruned


def captured_then_pruned(table: str) -> datetime:
    """Rows 0 to 4 of ``t`` captured, then deleted by retention (their batches aged past
    ``RETAINED``), then rows 5 to 7 captured: events 1 to 5 gone, 6 to 8 kept. Returns the
    store's time between the two."""
    from core.runtime import jobs
    from tests.helpers.capture import count_events, wait_for

    cfg = weir_config(table, [], store=RETAINED)
    with serving(cfg):
        insert_t(table, range(5))
        wait_for(lambda: count_events(table) == 5, what="capture")
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE weir.event_batches SET inserted_at = now() - interval '8 days'")
            assert jobs.prune_events(cfg, prepare(cfg)) == 5
            between: datetime = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        insert_t(table, range(5, 8))
        wait_for(lambda: count_events(table) == 3, what="capture")
    return between
