"""Relations (tables) as pgoutput describes them, and the turning of their rows into changes.

A Relation message arrives before the first change of a table in every replication session and
again after its schema changes; :class:`Relations` keeps what is needed to convert its rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from core.ids import collection_id_of, record_id_of
from core.redact import said
from core.sources.pg import columns
from core.sources.pg.encoding import UTF8_TEXT, SourceText, source_text
from core.sources.pg.pgoutput import UNCHANGED, Tuple, Value
from core.sources.pg.values import TYPES_SQL, Converter, TypeCatalog
from core.store.change import Change
from core.store.migrations import STORE_MARK
from core.tables import table_name

log = logging.getLogger("weir.source")

PRIMARY_KEY_SQL = """
SELECT a.attname
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
WHERE i.indrelid = %s AND i.indisprimary
ORDER BY array_position(i.indkey, a.attnum)
"""


class SourceSchemaError(RuntimeError):
    """A table cannot be captured as configured; the message says what to do."""


@dataclass(slots=True)
class Relation:
    relid: int
    schema: str
    table: str
    collection_id: str
    names: tuple[str, ...]
    converters: tuple[Converter, ...]
    key: tuple[int, ...]  # positions of the record-id columns
    identity: tuple[int, ...]  # positions of the replica identity columns (sent in 'K' tuples)
    # A partitioned table's partition key columns (its partitions' rows arrive under it).
    partition_key: tuple[str, ...] | None = None
    # Why its rows cannot be keyed; raised when a change of it arrives (pgoutput describes a
    # partition too before a change published under its partitioned table).
    problem: str | None = None
    ignored: bool = False  # not a table of the source's config: its changes are left out
    partition: bool = False  # a partition (its rows arrive under its table, via the root)
    # Reads the database's text as the server sends it (core/sources/pg/encoding.py).
    text: SourceText = UTF8_TEXT
    types: tuple[int, ...] = ()  # each column's type oid
    # Each column's other names in the record's versions before, where it had any, or None
    # when versions before cannot be trusted (core/sources/pg/columns.py).
    was: columns.Names | None = field(default_factory=dict)

    @property
    def shape(self) -> tuple[str, ...]:
        return shape_of(self.names, self.types)


def shape_of(names: Iterable[str], types: Iterable[int]) -> tuple[str, ...]:
    """A table's columns as 'name:type oid', in order: what its records are made with
    (core/store/collections.py ``set_shape``)."""
    return tuple(f"{n}:{t}" for n, t in zip(names, types, strict=True))


class Relations:
    """Relation cache of one replication session.

    ``catalog`` is an ordinary connection to the source database, used for type and primary-key
    look-ups when a relation is (re)described; never on the per-change path.
    """

    def __init__(
        self,
        catalog: psycopg.Connection[Any],
        key_columns: dict[str, list[str]] | None = None,
        wanted: Callable[[str, str], bool] | None = None,
        source: str = "",
    ) -> None:
        """``wanted(schema, table)``: whether its changes are captured (default: every
        table's); ``source`` names the source in what is logged of the others. Values and
        names come as the database holds them, read by ``text`` (which learns characters
        through ``catalog``)."""
        self.catalog = catalog
        self.key_columns = key_columns or {}
        self.text: SourceText = source_text(catalog)
        self.types = TypeCatalog(catalog.execute(TYPES_SQL).fetchall(), self.text)
        self.by_id: dict[int, Relation] = {}
        self.wanted = wanted
        self.source = source
        self.identities = columns.Identities()

    def _name(self, name: str) -> str:
        """A name pgoutput sent, in the database's encoding (see ``pgoutput._cstring``), as a
        UTF-8 client reads it from the catalog."""
        return str(self.text(name.encode(errors="surrogateescape")))

    def _key(
        self,
        relid: int,
        name: str,
        replident: str,
        names: tuple[str, ...],
        identity: tuple[int, ...],
    ) -> tuple[int, ...]:
        """The record-id columns of a relation as the change was made (pgoutput's columns and
        their identity flags), not as the catalog has it now: capture may lag behind a rename.

        ``key_columns``, else the replica identity (the primary key, or a unique index: a
        delete carries nothing else), else (REPLICA IDENTITY FULL) the primary key.
        """
        wanted = self.key_columns.get(name)
        if not wanted and replident in ("d", "i") and identity:
            pk = [r[0] for r in self.catalog.execute(PRIMARY_KEY_SQL, (relid,)).fetchall()]
            flagged = {names[i] for i in identity}
            # The primary key's order (a composite id lists it so), while it is the same key.
            return tuple(names.index(k) for k in pk) if set(pk) == flagged else identity
        if not wanted:
            wanted = [r[0] for r in self.catalog.execute(PRIMARY_KEY_SQL, (relid,)).fetchall()]
        if not wanted:
            raise SourceSchemaError(
                said(
                    "table %s has no primary key: add one, or set key_columns for "
                    "'%s' in the source's config",
                    name,
                    name,
                )
            )
        missing = [k for k in wanted if k not in names]
        if missing:
            raise SourceSchemaError(
                said(
                    "table %s: key columns %s are not in the table (as of the change "
                    "being captured): set key_columns to columns it has",
                    name,
                    missing,
                )
            )
        return tuple(names.index(k) for k in wanted)

    def add(self, msg: tuple[Any, ...], *, sent: bool = True) -> Relation:
        """A Relation message; ``sent``: its names are as pgoutput sent them (not read from
        the catalog)."""
        _, relid, schema, table, replident, cols = msg
        if sent:
            schema, table = self._name(schema), self._name(table)
            cols = [(c[0], self._name(c[1]), *c[2:]) for c in cols]
        kind = self.catalog.execute(
            "SELECT relkind, relispartition FROM pg_class WHERE oid = %s", (relid,)
        ).fetchone()
        if self.wanted is not None and not self.wanted(schema, table):
            return self._ignore(relid, schema, table, bool(kind and kind[1]))
        if any(not self.types.knows(c[2]) for c in cols):
            self.types.refresh(self.catalog.execute(TYPES_SQL).fetchall())
        names = tuple(c[1] for c in cols)
        identity = tuple(i for i, c in enumerate(cols) if c[0] & 1)
        try:
            name = table_name(schema, table)
            key, problem = self._key(relid, name, replident, names, identity), None
        except SourceSchemaError as e:
            key, problem = (), str(e)
        rel = Relation(
            relid,
            schema,
            table,
            collection_id_of(schema, table),
            names,
            tuple(self.types.converter(c[2]) for c in cols),
            key,
            identity,
            self._partition_key(relid) if kind is not None and kind[0] == "p" else None,
            problem,
            partition=bool(kind and kind[1]),
            text=self.text,
            types=tuple(c[2] for c in cols),
        )
        ids = columns.attnums(self.catalog, relid, rel.names, rel.types)
        rel.was = self.identities.describe(relid, rel.collection_id, rel.names, rel.types, ids)
        self.by_id[relid] = rel
        return rel

    def rewritten(self, relid: int) -> None:
        """The table's values changed with no change in the WAL (``ALTER … USING``): no value
        is taken from its records' versions before, this session (its description says so)."""
        self.identities.distrust(relid)
        if (rel := self.by_id.get(relid)) is not None:
            rel.was = None

    def _partition_key(self, relid: int) -> tuple[str, ...]:
        """The columns a partitioned table is partitioned by (none known for an expression)."""
        rows = self.catalog.execute(
            "SELECT a.attname FROM pg_partitioned_table p JOIN pg_attribute a"
            " ON a.attrelid = p.partrelid AND a.attnum = ANY (p.partattrs)"
            " WHERE p.partrelid = %s", (relid,)).fetchall()  # fmt: skip
        return tuple(r[0] for r in rows)

    def _store_table(self, relid: int) -> bool:
        """One of Weir's store tables (in a publication for all tables): never the source's."""
        row = self.catalog.execute(
            "SELECT obj_description(%s, 'pg_class') = %s", (relid, STORE_MARK)
        ).fetchone()
        return bool(row and row[0])

    def _ignore(self, relid: int, schema: str, table: str, partition: bool) -> Relation:
        """A table outside the source's config (a publication made for more, a table renamed
        or moved away, the store itself): left out, and said so once."""
        before = self.by_id.get(relid)
        name = table_name(schema, table)
        if before is not None and not before.ignored:
            log.warning("source %s: table %s was renamed or moved to %s, which the config does "
                        "not name: its changes are no longer captured (add it to tables:)",
                        self.source, table_name(before.schema, before.table), name)  # fmt: skip
        elif before is None and not partition and not self._store_table(relid):
            log.warning(
                "source %s: leaving out the changes of %s: it is in the publication but not in "
                "the source's tables: or schemas:", self.source, name,
            )  # fmt: skip
        rel = Relation(relid, schema, table, collection_id_of(schema, table), (), (), (), (),
                       ignored=True, partition=partition)  # fmt: skip
        self.by_id[relid] = rel
        return rel


def row_values(rel: Relation, values: Sequence[Value]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Converted values of a whole row, and the columns left out as unchanged TOAST values.

    A value no converter can read arrives as its Postgres text (core/sources/pg/values.py): no value
    can stop capture.
    """
    rec: dict[str, Any] = {}
    missing: tuple[str, ...] = ()
    for name, conv, v in zip(rel.names, rel.converters, values, strict=True):
        if v is None:
            rec[name] = None
        elif v is UNCHANGED:
            missing += (name,)
        else:
            try:
                rec[name] = conv(v)  # type: ignore[arg-type]
            except Exception:  # an odd spelling of a value: its text, never a stop
                rec[name] = rel.text(v)  # type: ignore[arg-type]
    return rec, missing


def key_values(rel: Relation, values: Tuple) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The identity columns of an old-key ('K') tuple (the server sends the others as null),
    and the other columns, whose values it leaves unknown."""
    rec, _ = row_values(rel, values)
    kept = {rel.names[i] for i in rel.identity}
    return {n: v for n, v in rec.items() if n in kept}, tuple(n for n in rel.names if n not in kept)


class UnknownKeyError(SourceSchemaError):
    """A row's key columns were not sent (unchanged TOAST values, and no old key)."""


def record_id_for(rel: Relation, rec: dict[str, Any], old: dict[str, Any] | None = None) -> str:
    """The record id of a row of ``rel`` from its converted values; key columns the row left
    out (unchanged TOAST values) are taken from ``old``, the old key the server sent then."""
    names = [rel.names[i] for i in rel.key]
    try:
        return record_id_of([rec[n] for n in names])
    except KeyError:
        if old is None or any(n not in old for n in names if n not in rec):
            raise UnknownKeyError(
                said(
                    "table %s: the server did not send the key columns of a row "
                    "(unchanged TOAST values): set REPLICA IDENTITY FULL on it",
                    table_name(rel.schema, rel.table),
                )
            ) from None
        return record_id_of([rec[n] if n in rec else old[n] for n in names])


def old_row(msg: tuple[Any, ...], rel: Relation) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The old values an Update carries (the whole row, or its key), and the columns left out."""
    _, _, old_kind, old, _ = msg
    return row_values(rel, old) if old_kind == "O" else key_values(rel, old)


def change_of(msg: tuple[Any, ...], rel: Relation, lsn: int, idx: int, ts: str) -> Change:
    """The Change for one decoded Insert, Update or Delete message of ``rel``."""
    tag = msg[0]
    if tag == "I":
        rec, missing = row_values(rel, msg[2])
        return Change(action="insert", collection_id=rel.collection_id,
                      record_id=record_id_for(rel, rec), record=rec, changes=None,
                      missing=missing, old_record_id=None, version=lsn, idx=idx,
                      committed_at=ts)  # fmt: skip
    if tag == "U":
        _, _, old_kind, old, new = msg
        changes, old_record_id = None, None
        old_missing: tuple[str, ...] = ()
        if old_kind == "O":
            # The whole old row (REPLICA IDENTITY FULL): what the new row left out as an
            # unchanged TOAST value is the old row's. ``changes``: the columns whose text
            # changed; one whose old value was left out too is decided by the store.
            new = [o if v is UNCHANGED else v for o, v in zip(old, new, strict=True)]
            before, _ = row_values(rel, old)
            changes = {n: before[n] for n, o, v in zip(rel.names, old, new, strict=True)
                       if o != v and o is not UNCHANGED}  # fmt: skip
            old_missing = tuple(n for n, o, v in zip(rel.names, old, new, strict=True)
                                if o is UNCHANGED and v is not UNCHANGED)  # fmt: skip
            old_record_id = record_id_for(rel, before)
        elif old_kind == "K":
            before, _ = key_values(rel, old)
            old_record_id = record_id_for(rel, before)
        else:
            before = None
        rec, missing = row_values(rel, new)
        return Change(action="update", collection_id=rel.collection_id,
                      record_id=record_id_for(rel, rec, before), record=rec, changes=changes,
                      missing=missing, old_record_id=old_record_id, version=lsn, idx=idx,
                      committed_at=ts, old_missing=old_missing)  # fmt: skip
    # Delete: the whole old row with REPLICA IDENTITY FULL, else only its key.
    _, _, old_kind, old = msg
    rec, missing = row_values(rel, old) if old_kind == "O" else key_values(rel, old)
    return Change(action="delete", collection_id=rel.collection_id,
                  record_id=record_id_for(rel, rec), record=rec, changes=None, missing=missing,
                  old_record_id=None, version=lsn, idx=idx, committed_at=ts)  # fmt: skip


def other_partition(key: tuple[str, ...], delete: Change, insert: Change) -> bool:
    """Whether the inserted row's partition key differs from the deleted one's: a row moved
    between partitions, not one deleted and inserted anew. Not known for a key that is an
    expression: the two changes are then kept as the WAL has them."""
    old, new = delete.record or {}, insert.record or {}
    return any(k in old and k in new and old[k] != new[k] for k in key)


def moved_row(delete: Change, insert: Change) -> Change:
    """A row moved between partitions (a delete and an insert of one record, one after the
    other in a transaction) is an update of the record (docs/configuration.md “Source database”)."""
    changes = None
    if not delete.missing and delete.record is not None and insert.record is not None:
        old, new = delete.record, insert.record
        changes = {k: v for k, v in old.items() if k in new and new[k] != v}
    return insert._replace(action="update", changes=changes, idx=delete.idx)
