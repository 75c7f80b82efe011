"""Findings of the Nov 29 (e) outside try-out, against real servers: each test states a promise
of docs/design.md “Values the WAL leaves out” and fails on the code it was written against.

The user's check: every update event (and the records stream's version it wrote) holds, for each
column it has, the value the table holds at that commit; a column may be left out, never wrong.
A table rewrite (``ALTER COLUMN ... TYPE ... USING``, ``ADD COLUMN ... DEFAULT volatile()``)
changes stored values without any decoded row change, so the record's previous version in the
store no longer holds the row's value, yet a later update that leaves the TOASTed value out is
filled from it. And a version written under an intermediate name (renamed away and back, or
renamed then dropped) is read under that name once another column takes it.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from tests.helpers import stored, toast
from tests.helpers.capture import wait_for
from tests.helpers.sql import execute
from tests.helpers.weir import serving, weir_config


def _updates(url: str, table: str) -> list[dict[str, Any]]:
    return [e for e in stored.events(url)
            if e["collection_id"] == f"public:{table}" and e["action"] == "update"]  # fmt: skip


def _wrong(url: str, table: str, want: dict[str, Any], rec: dict[str, Any] | None) -> list[str]:
    out = []
    event = _updates(url, table)[-1]["record"]
    for k, v in want.items():
        if k in event and event[k] != v:
            out.append(f"event {k}={toast.short(event[k])}, the row's {toast.short(v)}")
        if rec and k in rec and rec[k] != v:
            out.append(f"record {k}={toast.short(rec[k])}, the row's {toast.short(v)}")
    return out


def _record_now(url: str, table: str) -> dict[str, Any] | None:
    row = stored.record(url, f"public:{table}", "1")
    return row["record"] if row else None


def test_a_value_rewritten_by_alter_type_using_is_not_filled_from_before(db_url: str) -> None:
    """``ALTER TABLE ty ALTER COLUMN a TYPE text USING upper(a)`` rewrites every row (no row
    change is decoded); then ``UPDATE ty SET c = 1`` leaves the unchanged TOASTed ``a`` out. The
    event's ``a`` must be the row's (upper case) or left out: it is the value before the rewrite
    (a later backfill makes the records stream right; the event sent stays wrong)."""
    toast.table(db_url, "ty")
    with serving(weir_config(db_url, [])):
        toast.insert(db_url, "ty", 1, 2)
        execute(db_url, "ALTER TABLE ty ALTER COLUMN a TYPE text USING upper(a)",
                "UPDATE ty SET c = 1 WHERE id = 1")  # fmt: skip
        wait_for(lambda: bool(_updates(db_url, "ty")), what="the update")
        time.sleep(8)  # room for a backfill that would make the records stream right again
        rec = _record_now(db_url, "ty")
    want = toast.row(db_url, "ty", 1)
    assert want["a"] == toast.big(1).upper()
    wrong = _wrong(db_url, "ty", {"a": want["a"], "b": want["b"]}, rec)
    assert not wrong, wrong


def test_a_type_changed_with_using_is_not_filled_from_the_old_type(db_url: str) -> None:
    """``ALTER COLUMN a TYPE varchar USING 'v' || a`` (a new type, same attnum), then an update
    of ``c``: ``a`` must hold the row's varchar value or be left out."""
    toast.table(db_url, "tv")
    with serving(weir_config(db_url, [])):
        toast.insert(db_url, "tv", 3, 4)
        execute(db_url, "ALTER TABLE tv ALTER COLUMN a TYPE varchar USING 'v' || a",
                "ALTER TABLE tv ALTER COLUMN a SET STORAGE EXTERNAL",
                "UPDATE tv SET c = 1 WHERE id = 1")  # fmt: skip
        wait_for(lambda: bool(_updates(db_url, "tv")), what="the update")
        rec = _record_now(db_url, "tv")
    want = toast.row(db_url, "tv", 1)
    wrong = _wrong(db_url, "tv", {"a": want["a"], "b": want["b"]}, rec)
    assert not wrong, wrong


def test_a_value_rewritten_while_weir_is_stopped_is_not_filled_from_before(db_url: str) -> None:
    """The same rewrite (same name, type and place) while Weir is stopped; after its restart an
    update of ``c``: ``a`` must be the row's or left out."""
    toast.table(db_url, "ts")
    cfg = weir_config(db_url, [])
    with serving(cfg):
        toast.insert(db_url, "ts", 5, 6)
    execute(db_url, "ALTER TABLE ts ALTER COLUMN b TYPE text USING upper(b)")
    with serving(cfg, first=False):
        execute(db_url, "UPDATE ts SET c = 1 WHERE id = 1")
        wait_for(lambda: bool(_updates(db_url, "ts")), what="the update")
        rec = _record_now(db_url, "ts")
    want = toast.row(db_url, "ts", 1)
    wrong = _wrong(db_url, "ts", {"a": want["a"], "b": want["b"]}, rec)
    assert not wrong, wrong


_RANDOM_HEX = """CREATE FUNCTION big_hex() RETURNS text VOLATILE LANGUAGE sql AS $$
  SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 160) g $$"""


def test_a_column_dropped_and_added_again_while_stopped_keeps_no_old_value(db_url: str) -> None:
    """docs/design.md: a name "dropped and added again, also while Weir was stopped" takes no
    value from versions before. Table ``(id, a text, b text)``: while Weir is stopped ``DROP
    COLUMN b; ADD COLUMN b text DEFAULT big_hex()`` (volatile: every row gets a new TOASTed b in
    a rewrite, no row change decoded; same name, type and place as before). After restart an
    update of ``a`` leaves ``b`` out: it must be the new value or left out, not the dropped b's."""
    execute(db_url, "CREATE TABLE da (id int PRIMARY KEY, a text, b text)",
            "ALTER TABLE da ALTER COLUMN b SET STORAGE EXTERNAL", _RANDOM_HEX)  # fmt: skip
    cfg = weir_config(db_url, [])
    with serving(cfg):
        execute(db_url, "INSERT INTO da VALUES (1, 'x', %s)", params=(toast.big(7),))
        wait_for(lambda: stored.live_count(db_url, "public:da") == 1, what="the insert")
    execute(db_url, "ALTER TABLE da DROP COLUMN b",
            "ALTER TABLE da ADD COLUMN b text DEFAULT big_hex()")  # fmt: skip
    with serving(cfg, first=False):
        execute(db_url, "UPDATE da SET a = 'y' WHERE id = 1")
        wait_for(lambda: bool(_updates(db_url, "da")), what="the update")
        rec = _record_now(db_url, "da")
    want = toast.row(db_url, "da", 1)
    assert want["b"] != toast.big(7)
    wrong = _wrong(db_url, "da", {"b": want["b"]}, rec)
    assert not wrong, wrong


def test_renames_spread_over_two_restarts_do_not_fill_from_another_column(db_url: str) -> None:
    """Renames spread over stops: ``a→x`` while Weir is stopped (then a change of another row
    is captured, so the store notes the new names), then ``b→a`` while stopped again. Within one
    session this is the "name now belongs to another column" case (left out); across sessions
    the record last written before both still holds ``a`` = today's ``x`` column's value. An
    update of ``c`` of that record must not give ``a`` the value of ``x``."""
    n = 300
    toast.table(db_url, "rr")
    cfg = weir_config(db_url, [])
    with serving(cfg):
        with psycopg.connect(db_url) as conn:
            rows = [(i, toast.big(i), toast.big(-i)) for i in range(1, n + 1)]
            conn.cursor().executemany("INSERT INTO rr VALUES (%s, %s, %s, 0)", rows)
        wait_for(lambda: stored.live_count(db_url, "public:rr") == n, what="the inserts")
    execute(db_url, "ALTER TABLE rr RENAME COLUMN a TO x")
    with serving(cfg, first=False):
        execute(db_url, "UPDATE rr SET c = 5 WHERE id = 1")
        wait_for(lambda: bool(_updates(db_url, "rr")), what="the first update")
    execute(db_url, "ALTER TABLE rr RENAME COLUMN b TO a")
    with serving(cfg, first=False):
        execute(db_url, f"UPDATE rr SET c = 7 WHERE id = {n}")
        wait_for(lambda: any(e["record_id"] == str(n) for e in _updates(db_url, "rr")),
                 what="the second update")  # fmt: skip
        row = stored.record(db_url, "public:rr", str(n))
    want = toast.row(db_url, "rr", n)
    event = [e for e in _updates(db_url, "rr") if e["record_id"] == str(n)][-1]["record"]
    rec = row["record"] if row else {}
    wrong = [f"{w} {k}={toast.short(got[k])}, the row's {toast.short(v)}"
             for w, got in (("event", event), ("record", rec))
             for k, v in want.items() if k in got and got[k] != v]  # fmt: skip
    assert not wrong, wrong


_ROUND_TRIP = (
    "ALTER TABLE rt RENAME COLUMN a TO x",
    "UPDATE rt SET c = 1 WHERE id = 1",  # row 1's version: x = A1 (the column first named a)
    "ALTER TABLE rt RENAME COLUMN x TO a",
    "UPDATE rt SET c = 2 WHERE id = 2",  # described: a is its first name again
    "ALTER TABLE rt RENAME COLUMN b TO x",  # x is now the column first named b
    "UPDATE rt SET c = 3 WHERE id = 1",
)


def _round_trip(db_url: str, *steps: str) -> None:
    toast.table(db_url, "rt")
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO rt VALUES (1, %s, %s, 0), (2, %s, %s, 0)",
                params=(toast.big(11), toast.big(12), toast.big(13), toast.big(14)))  # fmt: skip
        wait_for(lambda: stored.live_count(db_url, "public:rt") == 2, what="the inserts")
        execute(db_url, *steps)
        wait_for(lambda: any(e["record"].get("c") == 3 for e in _updates(db_url, "rt")),
                 what="the last update")  # fmt: skip
        rec = _record_now(db_url, "rt")
    want = toast.row(db_url, "rt", 1)
    assert want["x"] == toast.big(12)
    event = [e for e in _updates(db_url, "rt") if e["record"].get("c") == 3][-1]["record"]
    wrong = [f"{w} {k}={toast.short(got[k])}, the row's {toast.short(v)}"
             for w, got in (("event", event), ("record", rec or {}))
             for k, v in want.items() if k in got and got[k] != v]  # fmt: skip
    assert not wrong, wrong


def test_a_name_renamed_away_and_back_then_given_to_another_column(db_url: str) -> None:
    """``a→x`` (row 1 updated: its version holds ``x`` = the first column's value), ``x→a``
    (another row updated), ``b→x``, then ``UPDATE rt SET c = 3 WHERE id = 1``: ``x`` is now the
    column first named ``b`` and must hold B1 or be left out; the store takes row 1's version's
    ``x`` (the other column's value, A1). Each step its own transaction, Weir running."""
    _round_trip(db_url, *_ROUND_TRIP)


def test_the_same_renames_in_one_transaction(db_url: str) -> None:
    """The same steps in one transaction (no backfill can come between)."""
    _round_trip(db_url, "BEGIN; " + "; ".join(_ROUND_TRIP) + "; COMMIT")


def test_a_renamed_column_dropped_then_its_name_given_to_another(db_url: str) -> None:
    """docs/design.md names "a column dropped and another renamed to its name" as a case where
    no value is taken. With a describe between the steps: ``a→x`` (row 1 updated: its version
    holds ``x``), ``DROP COLUMN x`` (row 2 updated), ``b→x``, then an update of row 1's ``c``:
    ``x`` must be B1 or left out, not the dropped column's A1."""
    toast.table(db_url, "rd")
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO rd VALUES (1, %s, %s, 0), (2, %s, %s, 0)",
                params=(toast.big(15), toast.big(16), toast.big(17), toast.big(18)))  # fmt: skip
        wait_for(lambda: stored.live_count(db_url, "public:rd") == 2, what="the inserts")
        execute(db_url, "ALTER TABLE rd RENAME COLUMN a TO x", "UPDATE rd SET c = 1 WHERE id = 1")
        wait_for(lambda: bool(_updates(db_url, "rd")), what="update 1")
        execute(db_url, "ALTER TABLE rd DROP COLUMN x", "UPDATE rd SET c = 2 WHERE id = 2")
        wait_for(lambda: len(_updates(db_url, "rd")) >= 2, what="update 2")
        execute(db_url, "ALTER TABLE rd RENAME COLUMN b TO x", "UPDATE rd SET c = 3 WHERE id = 1")
        wait_for(lambda: any(e["record"].get("c") == 3 for e in _updates(db_url, "rd")),
                 what="the last update")  # fmt: skip
        rec = _record_now(db_url, "rd")
    want = toast.row(db_url, "rd", 1)
    event = [e for e in _updates(db_url, "rd") if e["record"].get("c") == 3][-1]["record"]
    wrong = [f"{w} {k}={toast.short(got[k])}, the row's {toast.short(v)}"
             for w, got in (("event", event), ("record", rec or {}))
             for k, v in want.items() if k in got and got[k] != v]  # fmt: skip
    assert not wrong, wrong
