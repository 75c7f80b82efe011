"""Findings of the Nov 29 (c) outside try-out on data kept and sent (corrupted, duplicated or
lost), against real servers: each test states a promise of README.md / docs/ and fails on the
code it was written against, as its docstring tells what was seen."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psycopg

from devkit.embedded import EmbeddedNats
from tests.adversarial.stack import Stack
from tests.helpers import stored, toast
from tests.helpers.capture import wait_for
from tests.helpers.sql import execute
from tests.helpers.weir import serving, weir_config


def _seqs(url: str, collection: str) -> dict[str, int]:
    return {
        r["record_id"]: r["seq"] for r in stored.records(url) if r["collection_id"] == collection
    }


def _backfill_done_after(url: str, collection: str, t0: Any) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT finished_at IS NOT NULL FROM weir.backfills WHERE"
            " collection_id = %s AND started_at > %s",
            (collection, t0),
        ).fetchone()
    return bool(row and row[0])


def test_a_backfill_of_unchanged_rows_sends_no_record_again_when_their_history_is_spread(
    db_url: str,
) -> None:
    """docs/operations.md “Backfill and seed”: "a row equal to its record (the same names and
    values, numbers as written) is no new version: it keeps its seq and no reader gets it
    again". (It was compared within the 64 store batches holding most of a page's records
    only; the rest were written again.) A table of 1,000 rows,
    each last changed 10 to a transaction (as an OLTP table's rows are: no record alone in its
    batch), then ``ALTER COLUMN n TYPE bigint`` (same values, numbers as written): the backfill
    capture asks for re-sends the records whose batches were not among the 64 compared."""
    execute(db_url, "CREATE TABLE spread (id int PRIMARY KEY, n int, v text)")
    cfg = weir_config(db_url, [])
    with serving(cfg):
        execute(db_url, "INSERT INTO spread SELECT i, i, 'v' FROM generate_series(1, 1000) i")
        wait_for(lambda: stored.live_count(db_url, "public:spread") == 1000, what="the inserts")
        for b in range(100):  # 100 store batches of 10 records each
            execute(
                db_url,
                "UPDATE spread SET v = 'w' WHERE id > %s AND id <= %s",
                params=(b * 10, b * 10 + 10),
            )
            time.sleep(0.12)
        done = lambda: all(r["record"]["v"] == "w" for r in stored.records(db_url)  # noqa: E731
                           if r["collection_id"] == "public:spread")  # fmt: skip
        wait_for(done, what="the updates")
        with psycopg.connect(db_url) as conn:
            batches = conn.execute(
                "SELECT count(DISTINCT batch) FROM weir.record_index"
                " WHERE collection_id = 'public:spread'"
            ).fetchone()
        assert batches is not None and batches[0] >= 90, batches
        before = _seqs(db_url, "public:spread")
        with psycopg.connect(db_url) as conn:
            t0 = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        execute(db_url, "ALTER TABLE spread ALTER COLUMN n TYPE bigint")
        wait_for(lambda: _backfill_done_after(db_url, "public:spread", t0), timeout=120,
                 what="the backfill the new type asks for")  # fmt: skip
        after = _seqs(db_url, "public:spread")
    resent = sorted(int(r) for r in after if after[r] != before[r])
    assert not resent, f"{len(resent)} of 1000 unchanged records got a new seq (sent again)"


def test_an_update_after_a_toasted_column_is_renamed_holds_its_value_on_the_events_stream(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """docs/design.md “Values the WAL leaves out”: "Postgres does not send a TOASTed value ...
    that an update left as it was, yet each message holds it, on both streams ... with
    DEFAULT or USING INDEX from the record's previous version in the store". After
    ``ALTER TABLE t RENAME COLUMN big TO huge`` an update of another column leaves ``huge``
    out; the store's previous version holds the value (as ``big``). The NATS events
    subscriber gets ``{"id": 1, "a": 2}``: the column and its value are gone from the event
    (with REPLICA IDENTITY FULL it is there; the records stream converges)."""
    execute(db_url, "CREATE TABLE tr (id int PRIMARY KEY, big text, a int)",
            "ALTER TABLE tr ALTER COLUMN big SET STORAGE EXTERNAL")  # fmt: skip
    stack = Stack(db_url, nats_server, None)
    with stack.running():
        execute(db_url, "INSERT INTO tr VALUES (1, %s, 1)", params=(toast.big(1),))
        stack.sync()
        execute(db_url, "ALTER TABLE tr RENAME COLUMN big TO huge",
                "UPDATE tr SET a = 2 WHERE id = 1")  # fmt: skip
        stack.sync()
        want = toast.rows(db_url, "tr")["1"]
        update = [e for e in stack.events("public:tr") if e["action"] == "update"]
    assert len(update) == 1
    got = update[0]["record"]
    assert got == want, f"the update's event: {sorted(got)} (want {sorted(want)})"


def _live_ids(url: str, collection: str) -> list[str]:
    return sorted(r["record_id"] for r in stored.records(url, live_only=True)
                  if r["collection_id"] == collection)  # fmt: skip


def test_the_records_stream_follows_a_replica_identity_moved_to_another_index(
    db_url: str,
) -> None:
    """docs/design.md “Subjects and record ids”: "A record id is made of the columns the WAL
    names a deleted row by, the replica identity's: ... with REPLICA IDENTITY USING INDEX that
    index's columns"; docs/design.md “The store's layout”: "a change of key, name or columns
    makes capture ask for a backfill"; the records stream is "the latest version of each
    record". After ``ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_k_key`` on a table of 5
    backfilled rows (ids 1-5, k 101-105) the records stream keeps the old ids live for good,
    and an update of row 1 adds record ``101`` beside the still-live ``1``: the row is there
    twice, ['1', '101', '2', '3', '4', '5'] where the table has ['101', ..., '105']. Nothing
    is logged about the key change. (Failed 5 of 6 runs; it passed once, run after the
    other tests of this file.)"""
    execute(db_url, "CREATE TABLE ri (id int PRIMARY KEY, k int NOT NULL UNIQUE, v text)",
            "INSERT INTO ri SELECT i, i + 100, 'v' FROM generate_series(1, 5) i")  # fmt: skip
    cfg = weir_config(db_url, [], backfill={})
    want = [str(k) for k in range(101, 106)]
    with serving(cfg):
        wait_for(lambda: stored.live_count(db_url, "public:ri") == 5, what="the backfill")
        execute(db_url, "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_k_key",
                "UPDATE ri SET v = 'w' WHERE id = 1")  # fmt: skip
        with contextlib.suppress(AssertionError):  # the difference is named below
            wait_for(lambda: _live_ids(db_url, "public:ri") == want, timeout=30,
                     what="the records stream keyed by the new identity")  # fmt: skip
        got = _live_ids(db_url, "public:ri")
    assert got == want, f"live record ids {got}, the table's {want}"
