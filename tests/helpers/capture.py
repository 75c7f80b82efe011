"""Running a capture in a thread of the test process, and reading the store back."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from core.config.sources import PostgresSource
from core.sources.pg.capture import PostgresCapture
from core.store import Store
from tests.helpers import stored

# A table with a column of every kind of type, and a row of awkward values
# (docs/design.md “Values”).
KINDS_DDL = (
    "CREATE TYPE mood AS ENUM ('sad', 'happy')",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    """CREATE TABLE kinds (
        id bigint PRIMARY KEY, i2 smallint, i4 int, f4 real, f8 double precision,
        nan double precision, num numeric(12,4), b bool, t text, vc varchar(5), c char(3),
        ts timestamp, tstz timestamptz, d date, tm time, iv interval, j json, jb jsonb,
        u uuid, by bytea, arr int[], tarr text[], nested int[][], m mood, dom posint,
        nul text)""",
)
KINDS_ROW = """INSERT INTO kinds VALUES (
    9007199254740993, -3, 2147483647, 1.5, 0.1, 'NaN', 12345678.1234, true,
    'line1
            "quoted" \\ back', 'abc', 'x', '2026-11-22 10:00:00.5', '2026-11-22 12:00:00.123456+02',
    '2026-11-22', '10:11:12', '1 day 2 hours', '{"a": [1, 2]}', '{"b": {"c": null}}',
    'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff10', '{1,NULL,3}',
    '{"a,b","c\\"d",NULL,""}', '{{1,2},{3,4}}', 'happy', 5, NULL)"""


def pg_source(url: str, **overrides: Any) -> PostgresSource:
    spec: dict[str, Any] = {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]}
    spec.update(overrides)
    return PostgresSource.model_validate(spec)


def store_for(src: PostgresSource) -> Store:
    """The store in the source's own database, migrated, with the source registered."""
    store = Store(src.url.get_secret_value())
    store.prepare([src])
    return store


class _Recent(logging.Handler):
    """The last warnings Weir logged in this process: a wait that times out says them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: deque[str] = deque(maxlen=8)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}"[:300])


_recent = _Recent()
logging.getLogger("weir").addHandler(_recent)


def wait_for(check: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Polls ``check`` until it holds. A machine twice as slow as this one still passes: the
    limit only ends a wait that would never end."""
    deadline = time.monotonic() + timeout
    _recent.lines.clear()
    while not check():
        if time.monotonic() > deadline:
            said = "".join(f"\n  {line}" for line in _recent.lines) or " none"
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; Weir's last warnings:{said}"
            )
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
    return stored.events(url)


def records(url: str, live_only: bool = True) -> list[dict[str, Any]]:
    return stored.records(url, live_only=live_only)


def count_events(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT sum(last_seq - first_seq + 1) FROM weir.event_batches"
        ).fetchone()
        return int(row[0] or 0) if row else 0
