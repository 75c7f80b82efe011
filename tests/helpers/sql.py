"""Statements against a test database, and waiting for the records stream to show a table."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.helpers import stored
from tests.helpers.capture import wait_for


def execute(url: str, *statements: str, params: tuple[Any, ...] = ()) -> None:
    """Each statement in autocommit (a ``BEGIN; ...; COMMIT`` string is one transaction)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            conn.execute(s, params or None)


def rows(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, params or None).fetchall()


def wait_records(url: str, collection: str, n: int, schema: str = "weir") -> None:
    """Until the store holds ``n`` live records of ``collection``."""

    def count() -> bool:
        return stored.live_count(url, collection, schema) == n

    wait_for(count, timeout=60, what=f"{n} records of {collection}")
