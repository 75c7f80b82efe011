"""Generated tables of every kind of column, filled with hostile values, while Weir runs: each
subscriber (NATS and Kafka) and the records stream must equal the table, value for value, as
docs/design.md “Values” documents, and capture must go on (docs/design.md “Guarantees”)."""

from __future__ import annotations

import itertools
import random
import sys
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from psycopg import sql

from devkit.embedded import EmbeddedKafka, EmbeddedNats
from tests.adversarial.kinds import KINDS, TYPES_DDL, expected
from tests.adversarial.stack import Stack

_tables = itertools.count()
# (A composite of NULLs IS NULL, but is a value: its text is not NULL.)
OUTPUT = "CASE WHEN {c}::text IS NULL THEN NULL ELSE format('%s', {c}) END"
# The text docs/design.md “Values” documents values in: Weir's sessions run with these settings.
SESSION = ("-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=iso_8601"
           " -c extra_float_digits=3 -c bytea_output=hex")  # fmt: skip


def _expected_value(mapping: str, text: str | None, elements: Any) -> Any:
    if not mapping.startswith("array:") or text is None:
        return expected(mapping, text)
    dims, flat = elements
    values = [expected(mapping[6:], t) for t in flat or []]
    if not dims:
        return []
    shape = [int(hi) - int(lo) + 1 for lo, hi in (d.split(":") for d in dims[1:-1].split("]["))]
    for n in reversed(shape[1:]):
        values = [values[i : i + n] for i in range(0, len(values), n)]
    return values


def table_as_expected(
    conn: psycopg.Connection[Any], table: str, kinds: list[str]
) -> dict[str, Any]:
    """Each row of ``table`` as a subscriber must receive it, by record id."""
    cols = [f"c{i}" for i in range(len(kinds))]
    # Each value's text as its type's output function prints it (a cast to text may differ:
    # char(n) drops its padding, a boolean reads true).
    parts = [sql.SQL(OUTPUT).format(c=sql.Identifier(c)) for c in cols]
    for c, k in zip(cols, kinds, strict=True):
        if KINDS[k].mapping.startswith("array:"):
            # Elements as text (unnest of a composite array would expand its columns).
            parts.append(sql.SQL(
                "array_dims({c}), (SELECT array_agg(x ORDER BY n)"
                " FROM unnest({c}::text[]) WITH ORDINALITY u(x, n))"
            ).format(c=sql.Identifier(c)))  # fmt: skip
    query = sql.SQL("SELECT id, {} FROM {}").format(
        sql.SQL(", ").join(parts), sql.Identifier(table)
    )
    out = {}
    for row in conn.execute(query).fetchall():
        record: dict[str, Any] = {"id": row[0]}
        extra = iter(row[1 + len(cols) :])
        for c, k, text in zip(cols, kinds, row[1 : 1 + len(cols)], strict=True):
            mapping = KINDS[k].mapping
            elements = (next(extra), next(extra)) if mapping.startswith("array:") else None
            record[c] = _expected_value(mapping, text, elements)
        out[str(row[0])] = record
    return out


def test_every_value_reaches_subscribers_as_documented(
    adv_db: str, nats_server: EmbeddedNats, kafka_server: EmbeddedKafka
) -> None:
    with psycopg.connect(adv_db, autocommit=True) as conn:
        for ddl in TYPES_DDL:
            conn.execute(ddl)
    stack = Stack(adv_db, nats_server, kafka_server)
    rnd = random.Random(21)
    with stack.running(), psycopg.connect(adv_db, autocommit=True, options=SESSION) as conn:

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=6, unique=True),
               st.data())  # fmt: skip
        def case(kinds: list[str], data: st.DataObject) -> None:
            sys.setrecursionlimit(20_000)  # JSON nested 1024 deep, compared as lists
            table = f"v{next(_tables)}"
            cols = [f"c{i}" for i in range(len(kinds))]
            columns = ", ".join(f"{c} {KINDS[k].sql}" for c, k in zip(cols, kinds, strict=True))
            # A wide, incompressible value: stored out of line, so an update of another column
            # sends it as an unchanged TOAST value, which the records stream must keep.
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, big text, {columns})")
            row = st.tuples(*[st.none() | KINDS[k].values for k in kinds])
            rows = data.draw(st.lists(row, min_size=1, max_size=4))
            marks = ", ".join(f"%s::{KINDS[k].sql}" for k in kinds)
            insert = f"INSERT INTO {table} (id, big, {', '.join(cols)}) VALUES (%s, %s, {marks})"
            try:
                with conn.transaction():
                    for i, values in enumerate(rows):
                        big = rnd.randbytes(3000).hex()
                        conn.execute(insert, (i, big, *values))
                    if len(rows) > 1:  # an update of one column, and a delete
                        new = data.draw(st.none() | KINDS[kinds[0]].values)
                        conn.execute(f"UPDATE {table} SET c0 = %s::{KINDS[kinds[0]].sql}"
                                     " WHERE id = 0", (new,))  # fmt: skip
                        conn.execute(f"DELETE FROM {table} WHERE id = {len(rows) - 1}")
            except (psycopg.DataError, psycopg.errors.InvalidTextRepresentation):
                reject()  # a literal Postgres itself refuses
            stack.sync()
            want = table_as_expected(conn, table, kinds)
            bigs = dict(conn.execute(f"SELECT id::text, big FROM {table}").fetchall())
            for rid, rec in want.items():
                rec["big"] = bigs[rid]
            collection = f"public:{table}"
            seen = {
                "store": stack.store_records(collection),
                **stack.subscriber_records(collection),
            }
            for who, got in seen.items():
                live = {rid: rec for rid, (deleted, rec) in got.items() if not deleted}
                assert live == want, f"{who} differs from {table} ({kinds})"
                gone = [rid for rid, (deleted, _) in got.items() if deleted]
                assert gone == ([str(len(rows) - 1)] if len(rows) > 1 else []), who
            events = stack.events(collection)
            assert [e["action"] for e in events] == ["insert"] * len(rows) + (
                ["update", "delete"] if len(rows) > 1 else [])  # fmt: skip
            assert not stack.failed()

        case()
