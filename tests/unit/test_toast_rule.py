"""The rule for values the WAL leaves out (core/sources/pg/relations.py ``change_of`` and
core/store/records.py ``Previous``), over old and new rows of every kind pgoutput sends:
a REPLICA IDENTITY FULL update whose old row holds unchanged TOAST values too (some Postgres
versions send them so; 16 sends the old row whole, tests/adversarial/test_toast.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from core.sources.pg.pgoutput import UNCHANGED, Tuple
from core.sources.pg.relations import Relation, change_of, renamed, with_renames
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


def _described(names: tuple[str, ...], types: tuple[int, ...], before: Relation | None) -> Relation:
    rel = Relation(1, "public", "t", "public:t", names, (bytes.decode,) * len(names), (0,),
                   (0,), types=types)  # fmt: skip
    rel.was = renamed(before, rel)
    return rel


def test_an_unchanged_value_of_a_renamed_column_is_taken_from_its_old_name() -> None:
    """A column renamed (twice) while capture follows the table: an update leaving its TOASTed
    value out takes it from the version before, which holds it under its first name. A last
    column dropped and another of its type added looks like a rename, harmlessly: an added
    column's value is sent (no unchanged value of it exists before the row is written)."""
    first = _described(("id", "big", "a"), (23, 25, 23), None)
    second = _described(("id", "huge", "a"), (23, 25, 23), first)
    third = _described(("id", "vast", "a", "b"), (23, 25, 23, 25), second)
    fourth = _described(("id", "vast", "a", "c"), (23, 25, 23, 25), third)
    assert second.was == {"huge": "big"} and third.was == {"vast": "big"}
    assert fourth.was == {"vast": "big", "c": "b"}
    ch = with_renames(change_of(("U", 1, None, None, [b"1", UNCHANGED, b"2", b"x"]), fourth, 10,
                                0, ""), fourth)  # fmt: skip
    before = {"id": 1, "big": "B" * 3000, "a": 1}
    previous = Previous([ch], lambda keys: {("public:t", "1"): before})
    record, _ = previous.complete(ch)
    assert record == {"id": "1", "vast": "B" * 3000, "a": "2", "c": "x"}
    assert not previous.unfilled
