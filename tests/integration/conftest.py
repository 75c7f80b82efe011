"""Fixtures of the connector-specific tests."""

from __future__ import annotations

import psycopg
import pytest


@pytest.fixture
def table(db_url: str) -> str:
    """A database holding ``t (id int primary key, body text)``; rows go in by insert_t."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text NOT NULL)")
    return db_url
