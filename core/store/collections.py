"""A source's tables as capture last saw them (their key, oid and columns, in
``collections``), and the backfills capture asks for (``backfill_requests``): written on the
source writer's connection (core/store/writer.py), so that they commit with the changes that
made them so.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from psycopg import sql

from core.store import Conn, Store
from core.tables import table_name

log = logging.getLogger("weir.store")


class Collections:
    """One source's tables in the store, on its writer's connection."""

    def __init__(self, conn: Conn, store: Store, sync_id: uuid.UUID) -> None:
        self.conn = conn
        self.sync_id = sync_id
        requests = store.table("backfill_requests")
        self._request = sql.SQL(REQUEST_BACKFILL + REPLACE_REQUEST).format(requests)
        self._request_once = sql.SQL(REQUEST_BACKFILL + "DO NOTHING").format(requests)
        collections = store.table("collections")
        self._tables = sql.SQL(
            "SELECT collection_id, key_columns, relid FROM {} WHERE sync_id = %s"
        ).format(collections)
        self._shapes = sql.SQL(
            "SELECT collection_id, columns FROM {} WHERE sync_id = %s AND columns IS NOT NULL"
        ).format(collections)
        # A collection's table set, answering the key its records were made with (none: no row).
        self._set_table = sql.SQL(
            "WITH o AS (SELECT key_columns FROM {0} WHERE sync_id = %s AND collection_id = %s)"
            " INSERT INTO {0} (sync_id, collection_id, key_columns, relid) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (sync_id, collection_id) DO UPDATE SET key_columns ="
            " excluded.key_columns, relid = excluded.relid RETURNING (SELECT * FROM o)"
        ).format(collections)
        # A collection's columns set, answering those it had (none: no row).
        self._set_shape = sql.SQL(
            "UPDATE {0} n SET columns = %s FROM {0} o WHERE o.sync_id = n.sync_id"
            " AND o.collection_id = n.collection_id AND n.sync_id = %s AND n.collection_id = %s"
            " RETURNING o.columns"
        ).format(collections)
        self._forget_table = sql.SQL(
            "DELETE FROM {} WHERE sync_id = %s AND collection_id = %s"
        ).format(collections)

    def tables(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """Each collection's table as capture last saw it: (its key's columns, its oid)."""
        rows = self.conn.execute(self._tables, (self.sync_id,)).fetchall()
        self.conn.commit()
        return {str(r[0]): (tuple(r[1]), int(r[2])) for r in rows}  # type: ignore[arg-type, call-overload]

    def shapes(self) -> dict[str, tuple[str, ...]]:
        """Each collection's columns as last noted (``set_shape``), where they were."""
        rows: Any = self.conn.execute(self._shapes, (self.sync_id,)).fetchall()
        self.conn.commit()
        return {str(r[0]): tuple(r[1]) for r in rows}

    def set_shape(self, collection_id: str, table: tuple[str, str], shape: tuple[str, ...],
                  unseen: bool) -> None:  # fmt: skip
        """A collection's columns as capture sees them now (``Relation.shape``), with the next
        commit. When its records were made with others (ADD or DROP COLUMN, a type changed;
        capture saw them, or a backfill noted them), or with columns no one noted and
        ``unseen``, the table is backfilled, so that its records take the new shape without
        waiting for each row to change; rows whose record stays the same are not sent again
        (core/store/snapshot_writer.py)."""
        row: Any = self.conn.execute(self._set_shape, (list(shape), self.sync_id, collection_id)
                                     ).fetchone()  # fmt: skip
        before = None if row is None or row[0] is None else tuple(row[0])
        if before != shape and (before is not None or unseen):
            changed = "not noted before" if before is None else _difference(before, shape)
            log.info("the columns of %s changed (%s): its records take them by a backfill",
                     table_name(*table), changed)  # fmt: skip
            self.request_backfills([table], "its columns changed")

    def set_table(
        self, collection_id: str, key: tuple[str, ...] | None, relid: int,
        table: tuple[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Store a collection's table as capture sees it now (``key`` None: it is gone), with
        the next commit. When its records were keyed by other columns (its primary key,
        replica identity or ``key_columns`` changed; capture saw the old key, or a backfill
        noted it), ``table`` is backfilled, so that its records are keyed anew and the old
        ones become tombstones (the backfill's sweep)."""
        if key is None:
            self.conn.execute(self._forget_table, (self.sync_id, collection_id))
            return
        ids = (self.sync_id, collection_id)
        row: Any = self.conn.execute(self._set_table, (*ids, *ids, list(key), relid)).fetchone()
        before = tuple(row[0]) if row is not None and row[0] else ()
        if table is not None and before and before != key:
            log.warning("table %s is keyed by %s now, no longer by %s: its records are keyed "
                        "anew by a backfill", table_name(*table), ", ".join(key),
                        ", ".join(before))  # fmt: skip
            self.request_backfills([table], "the table's key changed")

    def request_backfills(
        self, tables: list[tuple[str, str]], reason: str, *, again: bool = True
    ) -> None:
        """Ask for a backfill of these (schema, table)s, with the next commit (sources/backfill.py
        runs it). ``again``: also when one is asked for already (it starts over); else that one
        stands (a request any role may write into the WAL cannot keep a backfill from ending)."""
        statement = self._request if again else self._request_once
        self.conn.cursor().executemany(
            statement, [(self.sync_id, schema, table, reason) for schema, table in tables]
        )


REQUEST_BACKFILL = """
INSERT INTO {} (sync_id, schema_name, table_name, reason) VALUES (%s, %s, %s, %s)
ON CONFLICT (sync_id, schema_name, table_name)
"""
REPLACE_REQUEST = "DO UPDATE SET reason = excluded.reason, requested_at = now()"


def _difference(before: tuple[str, ...], after: tuple[str, ...]) -> str:
    """The columns added (+), dropped (-) and of another type (~) between two shapes
    (``name:type oid`` each)."""
    old, new = (dict(c.rsplit(":", 1) for c in shape) for shape in (before, after))
    return ", ".join([f"+{n}" for n in new if n not in old] + [f"-{n}" for n in old if n not in new]
                     + [f"~{n}" for n in new if n in old and old[n] != new[n]]
                     ) or "names moved between columns"  # fmt: skip
