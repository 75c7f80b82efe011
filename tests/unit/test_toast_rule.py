"""The rule for values the WAL leaves out (core/sources/pg/relations.py ``change_of`` and
core/store/records.py ``Previous``), over old and new rows of every kind pgoutput sends:
a REPLICA IDENTITY FULL update whose old row holds unchanged TOAST values too (some Postgres
versions send them so; 16 sends the old row whole, tests/adversarial/test_toast.py)."""

from __future__ import annotations

from typing import Any

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


def _described(names: tuple[str, ...], types: tuple[int, ...], before: Relation | None,
               attnums: tuple[int, ...] | None = None) -> Relation:  # fmt: skip
    rel = Relation(1, "public", "t", "public:t", names, (bytes.decode,) * len(names), (0,),
                   (0,), types=types, attnums=attnums)  # fmt: skip
    rel.was = columns.was(before, rel, None)
    return rel


def _filled(rel: Relation, before: dict[str, Any]) -> dict[str, Any]:
    """The record an update leaving every column but id and the last out makes of ``before``."""
    new_row = [b"1", *[UNCHANGED] * (len(rel.names) - 2), b"2"]
    ch = columns.with_sources(change_of(("U", 1, None, None, new_row), rel, 10, 0, ""), rel)
    record, _ = Previous([ch], lambda keys: {("public:t", "1"): before}).complete(ch)
    assert record is not None
    return record


def test_an_unchanged_value_of_a_renamed_column_is_taken_from_its_old_name() -> None:
    """A column renamed (twice) while capture follows the table: an update leaving its TOASTed
    value out takes it from the version before, which holds it under its first name; a version
    written since, under the new one."""
    first = _described(("id", "big", "a"), (23, 25, 23), None)
    second = _described(("id", "huge", "a"), (23, 25, 23), first)
    third = _described(("id", "vast", "a", "b"), (23, 25, 23, 25), second)
    assert second.was == {"huge": "big"} and third.was == {"vast": "big"}
    assert _filled(third, {"id": 1, "big": "B", "a": 1}) == {"id": "1", "vast": "B", "a": 1,
                                                             "b": "2"}  # fmt: skip
    assert _filled(third, {"id": 1, "big": "old", "vast": "V", "a": 1})["vast"] == "V"


def test_a_name_another_column_had_takes_no_value_from_versions_before() -> None:
    """Two names swapped, a column dropped and another renamed to its name, one dropped and
    added again: versions before cannot tell which column a name was, so nothing is taken from
    them (the column is left out, never another column's value), by attnum or by place."""
    old = _described(("id", "a", "b", "c"), (23, 25, 25, 23), None, (1, 2, 3, 4))
    swapped = _described(("id", "b", "a", "c"), (23, 25, 25, 23), old, (1, 2, 3, 4))
    replaced = _described(("id", "a", "c"), (23, 25, 23), old, (1, 3, 4))
    again = _described(("id", "b", "c", "a"), (23, 25, 23, 25), old, (1, 3, 4, 5))
    dropped = _described(("id", "b", "c"), (23, 25, 23), old, (1, 3, 4))
    assert swapped.was is None and replaced.was is None and again.was is None
    assert dropped.was == {}  # by attnum: b is b
    assert _described(("id", "b", "a", "c"), (23, 25, 25, 23), old).was is None  # by place
    assert _described(("id", "b", "c"), (23, 25, 23), old).was is None  # a drop, by place
    before = {"id": 1, "a": "A", "b": "B", "c": 0}
    assert _filled(swapped, before) == {"id": "1", "c": "2"}
    assert _filled(dropped, before) == {"id": "1", "b": "B", "c": "2"}
