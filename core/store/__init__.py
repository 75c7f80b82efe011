"""The stream store: a Postgres schema holding every source's records and events streams."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
from psycopg import sql

from core.store.migrations import migrate

Conn = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True)
class Store:
    """Where the streams live. Holds no connection: each user opens its own."""

    url: str
    schema: str = "weir"

    def connect(self, *, autocommit: bool = False) -> Conn:
        return psycopg.connect(self.url, autocommit=autocommit, application_name="weir")

    def table(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(name))

    def migrate(self) -> int:
        with self.connect() as conn:
            return migrate(conn, self.schema)

    def register_source(
        self, conn: Conn, sync_id: uuid.UUID, name: str, kind: str, provider: str
    ) -> None:
        """Create the source's row on first start; a renamed source keeps its sync id's row."""
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (sync_id, name, kind, provider) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (sync_id) DO UPDATE SET name = excluded.name, "
                "kind = excluded.kind, provider = excluded.provider"
            ).format(self.table("sources")),
            (sync_id, name, kind, provider),
        )
