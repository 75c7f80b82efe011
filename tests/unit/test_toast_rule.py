"""The rule for values the WAL leaves out (core/sources/pg/relations.py ``change_of`` and
core/store/records.py ``Previous``), over old and new rows of every kind pgoutput sends:
a REPLICA IDENTITY FULL update whose old row holds unchanged TOAST values too (some Postgres
versions send them so; 16 sends the old row whole, tests/adversarial/test_toast.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.sources.pg import columns
from core.sources.pg.pgoutput import UNCHANGED, Tuple
from core.sources.pg.relations import Relation, change_of
from core.store.records import Previous

NAMES = ("id", "c1", "c2", "c3")
REL = Relation(1, "public", "t", "public:t", NAMES, (int, *[bytes.decode] * 3), (0,), (0, 1, 2, 3))
texts = st.sampled_from([b"x", b"y", b"z"])


@given(st.lists(st.tuples(texts, texts, st.booleans(), st.booleans()), min_size=3, max_size=3),
       st.booleans())  # fmt: skip
def test_changes_and_record_take_what_the_wal_left_out_from_the_version_before(
    columns: list[tuple[bytes, bytes, bool, bool]], stored: bool
) -> None:
    """Per column: old and new values, and whether the old and the new row left it out ('u':
    the new row only when it is the old value). The event's record is the new row; ``changes``
    the old value of each column whose value changed, known from the old row or the version
    before; with no version before, a value known nowhere is left out, never guessed."""
    old_row: Tuple = [b"1"]
    new_row: Tuple = [b"1"]
    record: dict[str, Any] = {"id": 1}
    changes: dict[str, Any] = {}
    for name, (old, new, old_out, new_out) in zip(NAMES[1:], columns, strict=True):
        new = old if new_out else new
        old_row.append(UNCHANGED if old_out else old)
        new_row.append(UNCHANGED if new_out else new)
        known = not (old_out and new_out) or stored
        if known:
            record[name] = new.decode()
        if old != new and (not old_out or stored):
            changes[name] = old.decode()
    before: dict[str, Any] = {"id": 1} | {
        n: old.decode() for n, (old, *_) in zip(NAMES[1:], columns, strict=True)
    }
    ch = change_of(("U", 1, "O", old_row, new_row), REL, 10, 0, "")
    previous = Previous([ch], lambda keys: {("public:t", "1"): before} if stored else {})
    assert previous.complete(ch) == (record, changes)
    assert bool(previous.unfilled) == (len(record) < len(NAMES))


def _described(identities: columns.Identities, names: tuple[str, ...],
               types: tuple[int, ...] | None = None,
               ids: tuple[int, ...] | None = None) -> Relation:  # fmt: skip
    types = types or (23,) + (25,) * (len(names) - 2) + (23,)
    rel = Relation(1, "public", "t", "public:t", names, (bytes.decode,) * len(names), (0,),
                   (0,), types=types)  # fmt: skip
    rel.was = identities.describe(1, "public:t", names, types, ids)
    return rel


def _filled(rel: Relation, before: dict[str, Any]) -> dict[str, Any]:
    """The record an update leaving every column but id and the last out makes of ``before``."""
    new_row = [b"1", *[UNCHANGED] * (len(rel.names) - 2), b"2"]
    ch = columns.with_sources(change_of(("U", 1, None, None, new_row), rel, 10, 0, ""), rel.was)
    record, _ = Previous([ch], lambda keys: {("public:t", "1"): before}).complete(ch)
    assert record is not None
    return record


def test_an_unchanged_value_of_a_renamed_column_is_taken_from_a_name_it_had() -> None:
    """A column renamed (twice, and back) while capture follows the table: an update leaving
    its TOASTed value out takes it from the version before, under whichever of its names that
    version holds (a column added meanwhile changes nothing)."""
    ids = columns.Identities()
    _described(ids, ("id", "big", "a"), (23, 25, 25), (1, 2, 3))
    _described(ids, ("id", "huge", "a"), (23, 25, 25), (1, 2, 3))
    third = _described(ids, ("id", "vast", "a", "n"), (23, 25, 25, 23), (1, 2, 3, 4))
    assert third.was == {"vast": ("big", "huge")}
    assert _filled(third, {"id": 1, "big": "B", "a": "A"}) == {
        "id": "1", "vast": "B", "a": "A", "n": "2"}  # fmt: skip
    assert _filled(third, {"id": 1, "huge": "H", "a": "A"})["vast"] == "H"
    back = _described(ids, ("id", "big", "a", "n"), (23, 25, 25, 23), (1, 2, 3, 4))
    assert _filled(back, {"id": 1, "vast": "V", "a": "A"})["big"] == "V"


@pytest.mark.parametrize(
    "steps",
    [
        [(("id", "b", "a", "c"), (1, 2, 3, 4))],  # two names swapped
        [(("id", "a", "c"), (1, 3, 4))],  # a dropped, b renamed to a
        [(("id", "x", "b", "c"), (1, 2, 3, 4)), (("id", "a", "b", "c"), (1, 2, 3, 4)),
         (("id", "a", "x", "c"), (1, 2, 3, 4))],  # a renamed to x and back, then b to x
        [(("id", "b", "c", "a"), (1, 3, 4, 5))],  # a dropped and added again
    ],
)  # fmt: skip
def test_a_name_another_column_had_takes_no_value_from_versions_before(
    steps: list[tuple[tuple[str, ...], tuple[int, ...]]],
) -> None:
    """Versions before cannot tell which column a name was once it was another's: nothing is
    taken from them for the rest of the session (the column is left out, never another
    column's value)."""
    ids = columns.Identities()
    _described(ids, ("id", "a", "b", "c"), (23, 25, 25, 23), (1, 2, 3, 4))
    rel = None
    for names, numbers in steps:
        rel = _described(ids, names, (23,) + (25,) * (len(names) - 2) + (23,), numbers)
    assert rel is not None and rel.was is None
    assert _filled(rel, {"id": 1, "a": "A", "b": "B", "x": "X", "c": 0}) == {
        "id": "1", rel.names[-1]: "2"}  # fmt: skip
    again = _described(ids, rel.names, rel.types, None)
    assert again.was is None  # for the rest of the session


def test_versions_are_not_trusted_after_a_type_change_a_rewrite_or_columns_changed_unseen() -> None:
    """A type changed (its values rewritten), values rewritten with no change in the WAL, a
    description that differs from the last with no attnums, or, first seen, columns other
    than those the store noted: no value is taken from versions before; a column dropped is
    no reason."""
    ids = columns.Identities()
    _described(ids, ("id", "a", "b", "c"), (23, 25, 25, 23), (1, 2, 3, 4))
    assert _described(ids, ("id", "a", "c"), (23, 25, 23), (1, 2, 4)).was == {}
    assert _described(ids, ("id", "a", "c"), (23, 1043, 23), (1, 2, 4)).was is None
    ids = columns.Identities()
    _described(ids, ("id", "a", "c"), (23, 25, 23), (1, 2, 3))
    assert _described(ids, ("id", "z", "c"), (23, 25, 23), None).was is None
    ids = columns.Identities()
    ids.noted = {"public:t": ("id:23", "a:25", "c:23")}
    assert _described(ids, ("id", "a", "c"), (23, 25, 23), (1, 2, 3)).was == {}
    ids.distrust(1)
    assert _described(ids, ("id", "a", "c"), (23, 25, 23), (1, 2, 3)).was is None
    ids = columns.Identities()
    ids.noted = {"public:t": ("id:23", "b:25", "a:25", "c:23")}
    assert _described(ids, ("id", "a", "b", "c"), (23, 25, 25, 23), (1, 2, 3, 4)).was is None


def test_a_table_under_a_name_whose_records_are_another_tables_is_not_trusted() -> None:
    """The store's records of a name are one table's (its oid): another table under that name
    (one dropped and another moved in, two tables' names swapped, also while Weir was
    stopped) takes no value from them."""
    cols: tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]] = (("id", "a"), (23, 25), (1, 2))
    ids = columns.Identities()
    ids.tables = {"public:t": 1}
    assert ids.describe(1, "public:t", *cols) == {}
    assert ids.describe(2, "public:t", *cols) is None
    ids = columns.Identities()
    assert ids.describe(1, "public:t1", *cols) == {}
    assert ids.describe(2, "public:t2", *cols) == {}
    assert ids.describe(1, "public:t2", *cols) is None
    assert ids.describe(2, "public:t1", *cols) is None
    ids = columns.Identities()
    assert ids.describe(1, "public:t1", *cols) == {}
    assert ids.describe(1, "public:t3", *cols) == {}  # renamed to a name no table had
