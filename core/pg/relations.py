"""Relations (tables) as pgoutput describes them, and the turning of their rows into changes.

A Relation message arrives before the first change of a table in every replication session and
again after its schema changes; :class:`Relations` keeps what is needed to convert its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from core.ids import collection_id_of, record_id_of
from core.pg.pgoutput import UNCHANGED, Tuple, Value
from core.pg.values import TYPES_SQL, Converter, TypeCatalog
from core.store.writer import Change
from core.tables import table_name

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


class Relations:
    """Relation cache of one replication session.

    ``catalog`` is an ordinary connection to the source database, used for type and primary-key
    look-ups when a relation is (re)described; never on the per-change path.
    """

    def __init__(
        self, catalog: psycopg.Connection[Any], key_columns: dict[str, list[str]] | None = None
    ) -> None:
        self.catalog = catalog
        self.key_columns = key_columns or {}
        self.types = TypeCatalog(catalog.execute(TYPES_SQL).fetchall())
        self.by_id: dict[int, Relation] = {}

    def add(self, msg: tuple[Any, ...]) -> Relation:
        _, relid, schema, table, _replident, cols = msg
        if any(not self.types.knows(c[2]) for c in cols):
            self.types.refresh(self.catalog.execute(TYPES_SQL).fetchall())
        names = tuple(c[1] for c in cols)
        identity = tuple(i for i, c in enumerate(cols) if c[0] & 1)
        key_names = self.key_columns.get(table_name(schema, table)) or [
            r[0] for r in self.catalog.execute(PRIMARY_KEY_SQL, (relid,)).fetchall()
        ]
        if key_names:
            missing = [k for k in key_names if k not in names]
            if missing:
                raise SourceSchemaError(
                    f"table {schema}.{table}: key columns {missing} are not in the table"
                )
            key = tuple(names.index(k) for k in key_names)
        elif identity and len(identity) < len(names):
            key = identity  # REPLICA IDENTITY USING INDEX: a unique index without a primary key
        else:
            raise SourceSchemaError(
                f"table {schema}.{table} has no primary key: add one, or set key_columns for "
                f"'{table_name(schema, table)}' in the source's config"
            )
        rel = Relation(
            relid,
            schema,
            table,
            collection_id_of(schema, table),
            names,
            tuple(self.types.converter(c[2]) for c in cols),
            key,
            identity,
        )
        self.by_id[relid] = rel
        return rel


def row_values(rel: Relation, values: Sequence[Value]) -> tuple[dict[str, Any], bool]:
    """Converted values of a whole row; ``partial`` when an unchanged TOAST value was left out."""
    rec: dict[str, Any] = {}
    partial = False
    for name, conv, v in zip(rel.names, rel.converters, values, strict=True):
        if v is None:
            rec[name] = None
        elif v is UNCHANGED:
            partial = True
        else:
            rec[name] = conv(v)  # type: ignore[arg-type]
    return rec, partial


def key_values(rel: Relation, values: Tuple) -> dict[str, Any]:
    """The identity columns of an old-key ('K') tuple; the server sends the others as null."""
    names, convs = rel.names, rel.converters
    out: dict[str, Any] = {}
    for i in rel.identity:
        v = values[i]
        out[names[i]] = None if v is None else convs[i](v)  # type: ignore[arg-type]
    return out


def record_id_for(rel: Relation, rec: dict[str, Any]) -> str:
    """The record id of a row of ``rel`` from its converted values."""
    names = rel.names
    return record_id_of([rec.get(names[i]) for i in rel.key])


def change_of(msg: tuple[Any, ...], rel: Relation, lsn: int, idx: int, ts: str) -> Change:
    """The Change for one decoded Insert, Update or Delete message of ``rel``."""
    tag = msg[0]
    if tag == "I":
        rec, partial = row_values(rel, msg[2])
        return Change(
            "insert",
            rel.collection_id,
            record_id_for(rel, rec),
            rec,
            None,
            partial,
            None,
            lsn,
            idx,
            ts,
        )
    if tag == "U":
        _, _, old_kind, old, new = msg
        rec, partial = row_values(rel, new)
        record_id = record_id_for(rel, rec)
        changes = None
        old_record_id = None
        if old_kind == "O":
            before, _ = row_values(rel, old)
            changes = {k: v for k, v in before.items() if k in rec and rec[k] != v}
            old_record_id = record_id_for(rel, before)
        elif old_kind == "K":
            old_record_id = record_id_for(rel, key_values(rel, old))
        return Change(
            "update",
            rel.collection_id,
            record_id,
            rec,
            changes,
            partial,
            old_record_id,
            lsn,
            idx,
            ts,
        )
    # Delete: the whole old row with REPLICA IDENTITY FULL, else only its key.
    _, _, old_kind, old = msg
    if old_kind == "O":
        rec, partial = row_values(rel, old)
    else:
        rec, partial = key_values(rel, old), True
    return Change(
        "delete", rel.collection_id, record_id_for(rel, rec), rec, None, partial, None, lsn, idx, ts
    )
