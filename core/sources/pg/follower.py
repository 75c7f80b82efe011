"""The source's tables as capture follows them: each collection's table (its key's columns and
its oid), renames, moves, drops and keys that change, the event trigger's messages
(sources/pg/follow.py), and a publication Weir does not manage (sources/pg/watch.py). What it finds
goes to the store thread: backfills to ask for, tables to note, and through ``drop`` (the
stream's, which keeps the transaction's order) collections whose records end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import sql

from core.ids import collection_id_of, lsn_to_str
from core.redact import said
from core.sources.pg import snapshot
from core.sources.pg.follow import (
    ALTERED_PREFIX,
    BACKFILL_PREFIX,
    KEYLESS_PREFIX,
    LEFT_PREFIX,
    MISSED_PREFIX,
    REWRITTEN_PREFIX,
)
from core.sources.pg.relations import Relation, Relations, shape_of
from core.sources.pg.setup import complete_publication
from core.sources.pg.store_thread import StoreThread
from core.sources.pg.tables import TABLE_INFO_SQL, UNREADABLE_NAME, table_problem
from core.sources.pg.watch import PublicationWatch
from core.tables import table_name

if TYPE_CHECKING:
    from core.config.sources import PostgresSource

log = logging.getLogger("weir.source")

PUBLICATION_AGAIN = 10  # seconds before the publication is changed again, when it could not be


class TableFollower:
    """The tables of one replication session's stream (core/sources/pg/stream.py)."""

    def __init__(
        self,
        src: PostgresSource,
        catalog: psycopg.Connection[Any],
        relations: Relations,
        store: StoreThread,
        tables: dict[str, tuple[tuple[str, ...], int]],
        drop: Callable[[str], None],
    ) -> None:
        self.src, self.catalog, self.relations, self.store = src, catalog, relations, store
        self.drop = drop  # every record of a collection ends, in the transaction's order
        # Each collection's table as last seen (its key's columns, its oid), and back.
        self.tables = tables
        self.by_relid = {relid: c for c, (_, relid) in tables.items()}
        self.publication_again: float | None = None  # when to change it again (_missed)
        self.watch = (
            None
            if src.create_publication
            else PublicationWatch(catalog, src.publication, relations.wanted)
        )

    def seen(self, rel: Relation) -> None:
        """A table described (again): note its key and oid. When its key changed (key_columns
        edited, another primary key or replica identity), backfill it, so its records are keyed
        anew and the old ones become tombstones (the backfill's sweep). When it had another
        name (renamed, moved to another schema), the old name's records are gone, and the new
        name's are backfilled; one moved out of the config's tables is remembered, by its oid,
        so that it is backfilled if it comes back (its changes in between were not taken)."""
        if rel.problem is not None or rel.partition:
            return
        before = self.by_relid.get(rel.relid)
        away = ((), rel.relid)  # a table moved out of the config's tables: no key of its own
        if before is not None and before != rel.collection_id:
            self._renamed(before, rel.relid, rel.schema, rel.table, ignored=rel.ignored)
        if rel.ignored:
            return
        key = tuple(rel.names[i] for i in rel.key)
        known = self.tables.get(rel.collection_id)
        if known != (key, rel.relid):
            if known == away:
                self._backfill(rel.schema, rel.table,
                               "the table came back into the source's tables")  # fmt: skip
            elif known is not None and known[1] != rel.relid:  # one renamed to it, say
                self._backfill(rel.schema, rel.table, "another table took the name")
            self.tables[rel.collection_id] = (key, rel.relid)
            self.by_relid[rel.relid] = rel.collection_id
            # A key other than the records' is decided there: the store knows what keyed them.
            self.store.submit("table", (rel.collection_id, key, rel.relid,
                                        (rel.schema, rel.table)))  # fmt: skip
        self._reshaped(rel.collection_id, rel.schema, rel.table, rel.shape)

    def _renamed(self, before: str, relid: int, schema: str, table: str, *, ignored: bool) -> None:
        """The table known as ``before`` has another name: the old name's records are gone, and
        the new name's are backfilled; moved out of the config's tables (``ignored``) it is
        remembered as away until it comes back."""
        away = ((), relid)
        was_away = self.tables.get(before) == away
        if not was_away:
            self.drop(before)
        if ignored:  # its records are tombstones until it comes back (backfilled then)
            if not was_away:
                self.tables[before] = away
                self.store.submit("table", (before, (), relid))
            return
        self.tables.pop(before, None)
        self.store.submit("table", (before, None, relid))
        self._backfill(schema, table, "the table was renamed")

    def _altered(self, relid: int, schema: str, table: str) -> None:
        """A published table was altered (the trigger says so by its oid): renamed, or its
        columns changed, it is taken as such now, not at its next change (a table seldom written
        would keep its old name, and its records their old shape)."""
        collection = collection_id_of(schema, table)
        if self._name_of(relid) != (schema, table):
            return  # not so named now (forged, renamed again)
        before = self.by_relid.get(relid)
        if before is not None and before != collection:
            self._renamed(before, relid, schema, table, ignored=False)
            self.by_relid[relid] = collection
        rows = self.catalog.execute(snapshot.COLUMNS_SQL, (schema, table)).fetchall()
        shape = shape_of([r[2] for r in rows], [r[3] for r in rows])  # as a backfill reads it
        # A table capture has not seen a change of, and no backfill noted, may have had other
        # columns, which its records hold: it is backfilled (equal rows are not sent).
        self._reshaped(collection, schema, table, shape, unseen=before is None)

    def _reshaped(
        self, collection: str, schema: str, table: str, shape: tuple[str, ...],
        *, unseen: bool = False,
    ) -> None:  # fmt: skip
        """A table's columns as capture sees them now: the store compares them with those its
        records were last made with (core/store/collections.py ``set_shape``)."""
        self.store.submit("shape", (collection, (schema, table), shape, unseen))

    def _backfill(self, schema: str, table: str, reason: str) -> None:
        """A backfill of the table, after any that runs already (its snapshot may be older
        than what is missing)."""
        self.store.submit("backfill", ((schema, table), reason))

    def message(self, prefix: str, content: bytes, lsn: int) -> None:
        """A message of Weir's event trigger or setup (core/sources/pg/setup.py): a table joined the
        publication with rows of its own (backfill it), or was dropped (its records are gone).
        Any role may write such a message: only a table of this source's is taken, and a drop
        only of a table that is gone."""
        try:
            # The message's text is as the database holds it, as a change's values are.
            schema, table, *why = orjson.loads(self.relations.text(content))
            if not all(isinstance(v, str) for v in (schema, table, *why)):
                raise ValueError(content)
        except (ValueError, TypeError):
            log.warning("source %s: ignored a %s message that names no table, in the "
                        "transaction at %s", self.src.name, prefix,
                        lsn_to_str(lsn))  # fmt: skip
            return
        try:
            self._followed(prefix, schema, table, why)
        except UNREADABLE_NAME as e:  # capture goes on: it stopped for good (a tryout)
            log.warning("%s", said("source %r: table %s changed, and a name of it has a "
                                   "character no UTF-8 client can read (%s): its records keep "
                                   "their shape until their rows change; rename it",
                                   self.src.name, table_name(schema, table), e))  # fmt: skip

    def _followed(self, prefix: str, schema: str, table: str, why: list[str]) -> None:
        """What the message of ``prefix`` about ``schema.table`` makes capture do."""
        if prefix == BACKFILL_PREFIX and why and why[0].isdigit():
            # The table's name now (renamed since, say), known by its oid from here on, so that
            # capture follows a rename that comes before its first change.
            relid, now = int(why[0]), self._name_of(int(why[0]))
            if now is not None:
                schema, table = now
                self.by_relid.setdefault(relid, collection_id_of(schema, table))
        wanted = self.relations.wanted
        if wanted is not None and not wanted(schema, table):
            return
        if prefix == BACKFILL_PREFIX:
            # Asked for anew also while one runs: its snapshot may be older than changes made
            # while the table was out of the publication (it left and came back).
            self._backfill(schema, table, "the table joined the publication with rows in it")
            return
        if prefix == REWRITTEN_PREFIX:  # its values changed with no change in the WAL
            if why and why[0].isdigit():  # its oid, which the trigger sends
                self.relations.rewritten(int(why[0]))
            self._backfill(
                schema,
                table,
                "its values changed with no change in the WAL (ALTER TABLE … USING, an enum "
                "label renamed, a composite type altered, a partition attached or detached)",
            )
            return
        if prefix == ALTERED_PREFIX:
            if why and why[0].isdigit():
                self._altered(int(why[0]), schema, table)
            return
        if prefix == KEYLESS_PREFIX:
            name = table_name(schema, table)
            row = self.catalog.execute(TABLE_INFO_SQL, (schema, table)).fetchone()
            problem = table_problem(self.src, name, row) if row is not None else None
            if problem is not None:  # as at a start (core/sources/pg/setup.py)
                log.warning("source %s: not capturing: %s", self.src.name, problem)
            return
        if prefix == MISSED_PREFIX:
            self._missed(table_name(schema, table), " ".join(why))
            return
        if prefix == LEFT_PREFIX:
            log.warning("source %s: table %s left the publication: it has no key now (a "
                        "primary key or replica identity), so Postgres would refuse its updates "
                        "and deletes; it is captured again, and backfilled, once it has one",
                        self.src.name, table_name(schema, table))  # fmt: skip
            return
        collection = collection_id_of(schema, table)
        known = self.tables.get(collection)
        # Gone, or attached as a partition (its rows are its root's now).
        gone_sql = "SELECT coalesce((SELECT relispartition FROM pg_class WHERE oid = {}), true)"
        if known is not None:
            gone = self.catalog.execute(gone_sql.format("%s"), (known[1],)).fetchone()
        else:
            name = sql.Identifier(schema, table).as_string(self.catalog)
            gone = self.catalog.execute(gone_sql.format("to_regclass(%s)"), (name,)).fetchone()
        if gone is None or not gone[0]:
            return  # the table is there: nothing was dropped
        self.drop(collection)
        if known is not None:
            self.tables.pop(collection)
            self.by_relid.pop(known[1], None)
            self.store.submit("table", (collection, None, known[1]))

    def _name_of(self, relid: int) -> tuple[str, str] | None:
        """(schema, table) of the table with this oid now; None when there is none."""
        row = self.catalog.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,)).fetchone()  # fmt: skip
        return None if row is None else (str(row[0]), str(row[1]))

    def _missed(self, name: str, why: str) -> None:
        """The event trigger could not add a new table to the publication (a lock timeout,
        say): add it now (it is backfilled); its changes in between are not captured."""
        log.warning("source %s: table %s could not join the publication as it was made (%s); "
                    "adding it now (its rows are backfilled, its changes until now are not "
                    "captured)", self.src.name, name, why)  # fmt: skip
        self._complete_publication()

    def _complete_publication(self) -> None:
        """Add (or take out) what the trigger could not, waiting for the publication's lock a
        few seconds at most, and again a while later until that is done."""
        try:
            self.catalog.execute("SET lock_timeout = '5s'")
            complete_publication(self.catalog, self.src)
            self.publication_again = None
        except psycopg.Error as e:
            log.warning("source %s: could not change publication %s (%s): trying again in %ds",
                        self.src.name, self.src.publication, str(e).strip(),
                        PUBLICATION_AGAIN)  # fmt: skip
            self.publication_again = time.monotonic() + PUBLICATION_AGAIN
        finally:
            self.catalog.execute("RESET lock_timeout")

    def tick(self, now: float) -> None:
        """Now and then: a table a DBA took out of their publication is named (and backfilled
        once back); a publication change that could not be made is tried again."""
        if self.publication_again is not None and now >= self.publication_again:
            self._complete_publication()
        for schema, table in self.watch.left(now) if self.watch is not None else ():
            name, pub = table_name(schema, table), self.src.publication
            log.warning("source %s: table %s was taken out of publication %s: its changes are "
                        "not captured until it is added again (ALTER PUBLICATION %s ADD TABLE "
                        "%s); it is backfilled then", self.src.name, name, pub, pub,
                        name)  # fmt: skip
            self._backfill(schema, table, f"until it is in publication {pub}")
