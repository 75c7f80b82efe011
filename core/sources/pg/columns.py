"""Which names a table's columns had in a record's versions before (docs/design.md “Values the
WAL leaves out”): an update leaves an unchanged TOASTed value out, and the store takes it from
the record's version before, under a name the column had when that version was written.

pgoutput names columns only. The catalog's attnum is a column's identity, read when a relation
is described and the catalog still has the columns pgoutput sent. Each table keeps, for this
session, every name each of its columns had: a version holds one of them, and while no name
was ever another column's, the one it holds is the column's. A table is not trusted for the
rest of the session once that cannot be known: a table under a name whose records are
another table's (two tables' names swapped, one dropped and another given its name), a name
that another column had, a column
whose type changed, columns that changed with no attnums to tell them apart, values rewritten
with no change in the WAL (``ALTER … USING``), or, at its first description, columns other
than those the store noted (changed while Weir was stopped). Then no value is taken from a
version before: the column is left out (never a guess), and the store backfills the table
(core/store/writer.py ``_unfilled``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from core.sources.pg.tables import UNREADABLE_NAME
from core.store.change import Change

ATTNUMS_SQL = """
SELECT attname, atttypid::int, attnum FROM pg_attribute
WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
ORDER BY attnum
"""

Names = dict[str, tuple[str, ...]]  # a column's name -> the other names it had, where it had any


def attnums(catalog: psycopg.Connection[Any], relid: int, names: tuple[str, ...],
            types: tuple[int, ...]) -> tuple[int, ...] | None:  # fmt: skip
    """The columns' attnums, when the catalog has the columns pgoutput sent (else it moved on)."""
    try:
        with catalog.transaction():
            rows = catalog.execute(ATTNUMS_SQL, (relid,)).fetchall()
    except UNREADABLE_NAME:  # a name no UTF-8 client reads
        return None
    if [(r[0], r[1]) for r in rows] != list(zip(names, types, strict=True)):
        return None
    return tuple(int(r[2]) for r in rows)


class Identities:
    """The names each table's columns had this session, by attnum."""

    def __init__(self) -> None:
        self.noted: dict[str, tuple[str, ...]] = {}  # the store's shapes, set at session start
        self.tables: dict[str, int] = {}  # collection -> the table (oid) its records are of
        self._last: dict[int, tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...] | None]] = {}
        self._ids: dict[int, dict[str, int]] = {}  # relid -> name -> attnum (or place: -1-i)
        self._unsure: set[int] = set()  # tables not trusted for the rest of the session

    def distrust(self, relid: int) -> None:
        """Versions before are not the table's (its values changed with no change in the WAL)."""
        self._unsure.add(relid)

    def describe(self, relid: int, collection: str, names: tuple[str, ...],
                 types: tuple[int, ...], ids: tuple[int, ...] | None) -> Names | None:  # fmt: skip
        """A description of the table: each column's other names, or None (not trusted)."""
        if relid in self._unsure:
            return None
        if self.tables.setdefault(collection, relid) != relid:
            self.tables[collection] = relid
            return self._unsure_of(relid)  # the name's records are another table's
        last = self._last.get(relid)
        if last is None:
            noted = self.noted.get(collection)
            shape = tuple(f"{n}:{t}" for n, t in zip(names, types, strict=True))
            if noted is not None and noted != shape:
                return self._unsure_of(relid)  # its columns changed while Weir was stopped
        elif (names, types) == last[:2]:
            ids = last[2]  # the columns as first told apart
        elif ids is None or last[2] is None:
            return self._unsure_of(relid)
        elif any(dict(zip(last[2], last[1], strict=True)).get(a, t) != t
                 for a, t in zip(ids, types, strict=True)):  # fmt: skip
            return self._unsure_of(relid)  # a type changed: its values were rewritten
        known = self._ids.setdefault(relid, {})
        for i, name in enumerate(names):
            column = ids[i] if ids is not None else -1 - i
            if known.setdefault(name, column) != column:  # another column's name before
                return self._unsure_of(relid)
        self._last[relid] = names, types, ids
        had: dict[int, list[str]] = {}
        for name, column in known.items():
            had.setdefault(column, []).append(name)
        return {n: tuple(m for m in had[c] if m != n) for n, c in known.items()
                if n in names and len(had[c]) > 1}  # fmt: skip

    def _unsure_of(self, relid: int) -> Names | None:
        self.distrust(relid)
        return None


def with_sources(ch: Change, was: Names | None) -> Change:
    """``ch`` saying under which other names versions before may hold the values it lacks
    (``held_as``), or that none may be taken from them (``held_as`` None)."""
    if was is None:
        return ch._replace(held_as=None)
    pairs = tuple((n, was[n]) for n in ch.missing if n in was)
    return ch._replace(held_as=pairs) if pairs else ch
