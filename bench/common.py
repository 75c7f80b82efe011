"""What the benchmarks share (imported as a sibling module: run them as scripts)."""

from __future__ import annotations

import psycopg

from core.embedded import EmbeddedPostgres


def new_db(server: EmbeddedPostgres, name: str) -> str:
    """A new database on the server holding an empty ``bench (id, v, name)`` table."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, v int NOT NULL, name text)")
    return url
