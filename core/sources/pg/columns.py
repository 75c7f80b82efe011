"""Which column of a record's versions before each column of a table is (docs/design.md
“Values the WAL leaves out”): an update leaves an unchanged TOASTed value out, and the store
takes it from the record's version before, under the name the column had when that version was
written. pgoutput names columns only. The catalog's attnum is a column's identity, read when a
relation is described and the catalog still has the columns pgoutput sent; else the columns'
places tell a rename only when no name was reused.

A description's ``was`` maps a column to its name in versions before: a renamed one to its old
name (a version written since holds the new name, which is taken first: the store fills a name
from its old one only where the version lacks it). When a name now belongs to another column
than in versions before (two names swapped, a column dropped and another renamed to its name,
one dropped and added again) the versions cannot tell which is which: ``was`` is None and no
value is taken from them, the column is left out (never a guess) and the store backfills the
table (core/store/writer.py ``_unfilled``).
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from core.sources.pg.tables import UNREADABLE_NAME
from core.store.change import Change


class Relation(Protocol):
    """What of a table's description (core/sources/pg/relations.py) this module reads."""

    names: tuple[str, ...]
    types: tuple[int, ...]
    attnums: tuple[int, ...] | None
    was: dict[str, str] | None
    ignored: bool


ATTNUMS_SQL = """
SELECT attname, atttypid::int, attnum FROM pg_attribute
WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
ORDER BY attnum
"""


def attnums(catalog: psycopg.Connection[Any], relid: int, names: tuple[str, ...],
            types: tuple[int, ...]) -> tuple[int, ...] | None:  # fmt: skip
    """The columns' attnums, when the catalog has the columns pgoutput sent (else it moved on)."""
    try:
        with catalog.transaction():
            rows = catalog.execute(ATTNUMS_SQL, (relid,)).fetchall()
    except UNREADABLE_NAME:  # a name no UTF-8 client reads: the places tell what they can
        return None
    if [(r[0], r[1]) for r in rows] != list(zip(names, types, strict=True)):
        return None
    return tuple(int(r[2]) for r in rows)


def was(
    old: Relation | None, new: Relation, noted: tuple[str, ...] | None
) -> dict[str, str] | None:
    """``new``'s columns' names in versions before; None when that cannot be known. ``old``: the
    description before, this session; ``noted``: the columns the store noted last (its shape,
    core/store/collections.py ``set_shape``), for a table first described this session."""
    if old is None or old.ignored:
        if noted is None:
            return {}
        cols = [c.rpartition(":") for c in noted]
        if [int(c[2]) for c in cols] != list(new.types[: len(cols)]):
            return None  # a column dropped, or a type changed, while Weir was stopped
        return _by_identity([c[0] for c in cols], {}, new.names, None)
    if old.was is None:
        return None
    if old.attnums is not None and new.attnums is not None:
        return _by_identity(old.names, old.was, new.names, (old.attnums, new.attnums))
    if new.types[: len(old.types)] != old.types:  # a column dropped, or a type changed
        return None
    return _by_identity(old.names, old.was, new.names, None)


def _by_identity(
    names: list[str] | tuple[str, ...], known: dict[str, str], new: tuple[str, ...],
    attnums: tuple[tuple[int, ...], tuple[int, ...]] | None,
) -> dict[str, str] | None:  # fmt: skip
    """Each new column's name in versions before, the columns told apart by attnum, or else by
    place (the same columns, some renamed, some added at the end); None when a name is now
    another column's than in some version (in the description before, or as a first name)."""
    ids_before, ids_now = attnums or (range(len(names)), range(len(new)))
    firsts = {i: known.get(n, n) for i, n in zip(ids_before, names, strict=True)}
    holders: dict[str, int] = {}
    for i, n in zip(ids_before, names, strict=True):
        holders[n] = holders[firsts[i]] = i
    out: dict[str, str] = {}
    for i, name in zip(ids_now, new, strict=True):
        if holders.get(name, i) != i:
            return None
        first = firsts.get(i)
        if first is not None and first != name:
            out[name] = first
    return out


def with_sources(ch: Change, rel: Relation) -> Change:
    """``ch`` saying where the values it lacks are held in versions before: under another name
    (renamed), or nowhere that can be known (``renamed`` None)."""
    if rel.was is None:
        return ch._replace(renamed=None)
    pairs = tuple((n, rel.was[n]) for n in ch.missing if n in rel.was)
    return ch._replace(renamed=pairs) if pairs else ch
