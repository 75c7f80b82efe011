"""Running a capture in a thread of the test process, and reading the store back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from core.config import PostgresSource
from core.pg.capture import PostgresCapture
from core.store import Store


def pg_source(url: str, **overrides: Any) -> PostgresSource:
    spec: dict[str, Any] = {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]}
    spec.update(overrides)
    return PostgresSource.model_validate(spec)


def store_for(src: PostgresSource) -> Store:
    """The store in the source's own database, migrated, with the source registered."""
    store = Store(src.url.get_secret_value())
    store.prepare([src])
    return store


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def capturing(src: PostgresSource) -> Iterator[PostgresCapture]:
    """A running capture; stops it on exit and re-raises anything it failed with."""
    capture = PostgresCapture(src, store_for(src))
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            capture.run(stop)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        wait_for(lambda: capture.state == "streaming" or bool(errors), what="streaming")
        if errors:
            raise errors[0]
        yield capture
    finally:
        stop.set()
        thread.join(30)
    if errors:
        raise errors[0]


def events(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM weir.events ORDER BY sync_id, seq").fetchall()


def records(url: str, live_only: bool = True) -> list[dict[str, Any]]:
    where = "WHERE NOT deleted" if live_only else ""
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(f"SELECT * FROM weir.records {where} ORDER BY seq").fetchall()


def count_events(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM weir.events").fetchone()
        return int(row[0]) if row else 0
