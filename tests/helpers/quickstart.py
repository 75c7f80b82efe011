"""The README's quickstart as a DBA runs it: a server whose database ``app`` and its tables
belong to the role ``app``, and the quickstart's SQL run on it as written (Weir's role logging
in with a password, its store database, the grant, the publication made by the tables' owner)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from devkit.embedded import EmbeddedPostgres

README = Path(__file__).resolve().parents[2] / "README.md"
ROLE, PASSWORD = "weir_cdc", "change-me"  # the quickstart's


def quickstart() -> dict[str, str]:
    """The quickstart's code blocks by language (sql, yaml, sh), as the README writes them;
    the blocks of one language one after the other."""
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, str] = {}
    for lang, code in re.findall(r"```(\w+)\n(.*?)```", section, re.S):
        blocks[lang] = blocks.get(lang, "") + code
    return blocks


def statements(sql: str) -> list[str]:
    """The SQL statements, without comments and psql's commands (``\\c app``: the test's
    connection is to app already)."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith(("--", "\\"))]
    return [s.strip() for s in " ".join(lines).split(";") if s.strip()]


def db_url(pg: EmbeddedPostgres, db: str, user: str = "postgres", password: str = "") -> str:
    login = f"{user}:{password}" if password else user
    return f"postgresql://{login}@127.0.0.1:{pg.port}/{db}"


@contextmanager
def quickstart_server() -> Iterator[EmbeddedPostgres]:
    """A server set up as the README's quickstart says, its tables ``users`` and ``orders``
    empty; Weir's role logs in with a password over TCP (scram), as a DBA's would."""
    with EmbeddedPostgres() as pg:
        hba = pg.data / "pg_hba.conf"
        hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n"
                       f"host replication {ROLE} 127.0.0.1/32 scram-sha-256\n"
                       + hba.read_text())  # fmt: skip
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE app LOGIN")
            conn.execute("CREATE DATABASE app OWNER app")
            conn.execute("SELECT pg_reload_conf()")
        sql = statements(quickstart()["sql"])
        with psycopg.connect(db_url(pg, "app"), autocommit=True) as conn:
            conn.execute("SET ROLE app")
            conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text)")
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, user_id int, total numeric)")
            for statement in sql:
                if statement.startswith("CREATE PUBLICATION"):  # as the tables' owner
                    conn.execute(statement)
            conn.execute("RESET ROLE")
            for statement in sql:
                if not statement.startswith("CREATE PUBLICATION"):  # as a superuser
                    conn.execute(statement)
        yield pg
