"""Tables with out-of-line (TOASTed) values, for the tests of values the WAL leaves out, and
the rows a UTF-8 client reads from them to compare with what Weir sent."""

from __future__ import annotations

import random
from typing import Any

import psycopg

from tests.helpers.sql import execute, wait_records

BIG = 2500  # random bytes, as 5000 hex digits: stored out of line; small values stay inline


def big(seed: int, size: int = BIG) -> str:
    """A value stored out of line, the same for the same ``seed``."""
    return random.Random(seed).randbytes(size).hex()


def table(url: str, name: str, cols: str = "a text, b text, c int") -> None:
    """``name`` (id int PRIMARY KEY, ``cols``), its columns ``a`` and ``b`` out of line
    uncompressed (STORAGE EXTERNAL): an update leaving them unchanged leaves them out."""
    execute(url, f"CREATE TABLE {name} (id int PRIMARY KEY, {cols})",
            f"ALTER TABLE {name} ALTER COLUMN a SET STORAGE EXTERNAL",
            f"ALTER TABLE {name} ALTER COLUMN b SET STORAGE EXTERNAL")  # fmt: skip


def insert(url: str, name: str, a: int, b: int) -> None:
    """Row 1 of ``name`` (``big(a)``, ``big(b)``, 0), once the store holds it as a live record."""
    execute(url, f"INSERT INTO {name} VALUES (1, %s, %s, 0)", params=(big(a), big(b)))
    wait_records(url, f"public:{name}", 1)


def partitioned(url: str, pq_cols: str = "id int PRIMARY KEY, a text, b text, c int") -> None:
    """Root ``pp`` with partition ``pp1`` (ids 1-99) and ``pq`` to swap in, a and b out of line."""
    execute(url,
            "CREATE TABLE pp (id int PRIMARY KEY, a text, b text, c int) PARTITION BY RANGE (id)",
            "CREATE TABLE pp1 PARTITION OF pp FOR VALUES FROM (1) TO (100)",
            "ALTER TABLE pp1 ALTER COLUMN a SET STORAGE EXTERNAL",
            "ALTER TABLE pp1 ALTER COLUMN b SET STORAGE EXTERNAL",
            f"CREATE TABLE pq ({pq_cols})",
            "ALTER TABLE pq ALTER COLUMN a SET STORAGE EXTERNAL",
            "ALTER TABLE pq ALTER COLUMN b SET STORAGE EXTERNAL")  # fmt: skip


def rows(url: str, name: str) -> dict[str, dict[str, Any]]:
    """The table's rows by id (as text), as a UTF-8 client reads them."""
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return {str(r["id"]): dict(r) for r in cur.execute(f"SELECT * FROM {name}").fetchall()}


def row(url: str, name: str, rid: int) -> dict[str, Any]:
    """Row ``rid`` of the table, which must be there."""
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        got = cur.execute(f"SELECT * FROM {name} WHERE id = %s", (rid,)).fetchone()
    assert got is not None, f"{name} has no row {rid}"
    return dict(got)


def short(v: Any) -> Any:
    """``v``, a long text cut to its first 12 characters (for readable failures)."""
    return v[:12] + "…" if isinstance(v, str) and len(v) > 16 else v
