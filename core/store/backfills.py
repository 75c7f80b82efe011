"""Table backfills in the store (table ``backfills``): where each one is, so that a backfill
killed at any point resumes after the last page it committed; and the backfills capture asked
for (``backfill_requests``). Used by core/sources/backfill.py, in its store transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from core.store import Conn, Store


@dataclass
class BackfillState:
    """A row of the backfills table."""

    keyset: list[str]  # the columns paged by, in order
    version: int  # the snapshot LSN its rows carry
    snapshot_at: datetime
    last_key: list[str] | None  # the keyset values of the last row written
    rows_total: int
    rows_read: int
    rows_written: int
    finished: bool
    started_at: datetime


class Backfills:
    """The backfills of one source; each method runs in the caller's transaction on ``conn``,
    which the caller commits."""

    def __init__(self, store: Store, sync_id: Any) -> None:
        self.store = store
        self.sync_id = sync_id
        t = store.table("backfills")
        self._load = sql.SQL(
            "SELECT keyset, version, snapshot_at, last_key, rows_total, rows_read, rows_written,"
            " finished_at IS NOT NULL, started_at"
            " FROM {} WHERE sync_id = %s AND collection_id = %s"
        ).format(t)
        self._start = sql.SQL(
            "INSERT INTO {} AS b (sync_id, collection_id, keyset, version, snapshot_at, rows_total)"
            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (sync_id, collection_id) DO UPDATE SET"
            " keyset = excluded.keyset, version = excluded.version,"
            " snapshot_at = excluded.snapshot_at, last_key = NULL,"
            " rows_total = excluded.rows_total, rows_read = 0, rows_written = 0,"
            " started_at = now(), updated_at = now(), finished_at = NULL"
        ).format(t)
        self._step = sql.SQL(
            "UPDATE {} SET last_key = %s, rows_read = rows_read + %s,"
            " rows_written = rows_written + %s, updated_at = now()"
            " WHERE sync_id = %s AND collection_id = %s"
        ).format(t)
        self._finish = sql.SQL(
            "UPDATE {} SET finished_at = now(), updated_at = now()"
            " WHERE sync_id = %s AND collection_id = %s"
        ).format(t)
        # The columns the table's records were made with (core/store/collections.py set_shape).
        self._made_with = sql.SQL(
            "INSERT INTO {} (sync_id, collection_id, key_columns, relid, columns)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (sync_id, collection_id)"
            " DO UPDATE SET columns = excluded.columns"
        ).format(store.table("collections"))

    def state(self, conn: Conn, collection_id: str) -> BackfillState | None:
        """The table's backfill, None when it never had one."""
        row = conn.execute(self._load, (self.sync_id, collection_id)).fetchone()
        return None if row is None else BackfillState(*row)  # type: ignore[arg-type]

    def start(
        self, conn: Conn, collection_id: str, keyset: list[str], version: int, at: datetime,
        rows_total: int,
    ) -> None:  # fmt: skip
        """Start the table's backfill at a snapshot, anew (forgetting one there was)."""
        conn.execute(self._start, (self.sync_id, collection_id, keyset, version, at, rows_total))

    def step(
        self, conn: Conn, collection_id: str, last_key: list[str], read: int, written: int
    ) -> None:
        """A page was written: its last row's keyset values, and the rows it read and wrote."""
        conn.execute(self._step, (last_key, read, written, self.sync_id, collection_id))

    def finish(
        self, conn: Conn, collection_id: str, key: list[str], relid: int, shape: tuple[str, ...]
    ) -> None:
        """The backfill is done; its rows were read with the table's key and columns."""
        conn.execute(self._finish, (self.sync_id, collection_id))
        self.made_with(conn, collection_id, key, relid, shape)

    def made_with(
        self, conn: Conn, collection_id: str, key: list[str], relid: int, shape: tuple[str, ...]
    ) -> None:
        """A backfill or a seed wrote the table's records with its key and these columns
        (``Relation.shape``), which capture compares with the table's when it changes."""
        conn.execute(self._made_with, (self.sync_id, collection_id, key, relid, list(shape)))

    def requests(self, conn: Conn) -> list[tuple[str, str, datetime]]:
        """(schema, table, when) of each backfill capture asked for, oldest first."""
        rows = conn.execute(
            sql.SQL(
                "SELECT schema_name, table_name, requested_at FROM {} WHERE sync_id = %s"
                " ORDER BY requested_at"
            ).format(self.store.table("backfill_requests")),
            (self.sync_id,),
        ).fetchall()
        return rows  # type: ignore[return-value]

    def request_done(self, conn: Conn, schema: str, table: str, requested_at: datetime) -> None:
        """Forget a request a backfill has answered (one asked again since stays)."""
        conn.execute(
            sql.SQL(
                "DELETE FROM {} WHERE sync_id = %s AND schema_name = %s"
                " AND table_name = %s AND requested_at = %s"
            ).format(self.store.table("backfill_requests")),
            (self.sync_id, schema, table, requested_at),
        )
