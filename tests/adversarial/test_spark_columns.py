"""The events stream's Arrow batches made column by column from the stored batches
(spark/arrow.py) hold the rows the connectors' reader makes of the same events
(spark/source.py ``_pages``), whatever the data, bucket or selection: generated rows of two
tables (text of any plane, empty and NULL values, jsonb, updates that change the key, deletes,
a truncate, transactions of several tables) captured by a live ``weir run``, then read in-process
without a JVM: each hash bucket of 1, 2 and 5, seq ranges cutting batches anywhere, and
selections by collection and action."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config.load import load_config
from spark.options import spec_of
from spark.source import Bucket, _batches, _pages
from tests.helpers import stored
from tests.helpers.capture import wait_for
from tests.helpers.weir import serving

_COLUMNS = ["sync_id", "provider", "collection_id", "record_id", "action", "seq",
            "committed_at", "record", "changes", "deleted"]  # fmt: skip
_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]),
                max_size=40)  # fmt: skip
_op = st.tuples(st.sampled_from(["insert", "update", "rekey", "delete"]),
                st.integers(0, 6), st.one_of(st.none(), _text), st.booleans())  # fmt: skip


def _head(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT events_seq FROM weir.sources WHERE name = 'app'").fetchone()
    return int(row[0]) if row else 0


def _apply(url: str, txns: list[list[tuple[str, int, str | None, bool]]], truncate: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for txn in txns:
            with conn.transaction():
                for op, key, text, other in txn:
                    table = "b" if other else "a"
                    doc = json.dumps({"t": text, "n": [key, None]})
                    if op == "insert":
                        upsert = " ON CONFLICT (id) DO UPDATE SET body = excluded.body"
                        conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)" + upsert,
                                     (key, text, doc))  # fmt: skip
                    elif op == "update":
                        conn.execute(f"UPDATE {table} SET body = %s, doc = %s WHERE id = %s",
                                     (text, doc, key))  # fmt: skip
                    elif op == "rekey":
                        conn.execute(f"UPDATE {table} SET id = id + 100 WHERE id = %s AND NOT "
                                     f"EXISTS (SELECT FROM {table} WHERE id = %s + 100)",
                                     (key, key))  # fmt: skip
                    else:
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
        if truncate:
            conn.execute("TRUNCATE b")


def _columnar(spec: Any, part: Bucket) -> list[dict[str, Any]]:
    out = list(_batches(spec, part))
    assert all(b.schema.names == _COLUMNS for b in out)
    return [row for b in out for row in b.to_pylist()]


def _row_path(spec: Any, part: Bucket) -> list[dict[str, Any]]:
    out = []
    for page in _pages(spec, part):
        for row in page:
            d = dict(zip(_COLUMNS, row, strict=True))
            d["committed_at"] = pa.scalar(d["committed_at"]).cast(pa.timestamp("us", "UTC")).as_py()
            out.append(d)
    return out


def test_columns_hold_the_rows_the_reader_makes(tmp_path: Path, table: str) -> None:
    with psycopg.connect(table, autocommit=True) as conn:
        for name in ("a", "b"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, body text, doc jsonb)")
        conn.execute("ALTER TABLE b REPLICA IDENTITY FULL")  # updates carry their changes
        conn.execute("CREATE TABLE m (id serial PRIMARY KEY)")
    config = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"],
              "max_batch": 7}  # fmt: skip
    config.write_text(json.dumps({"sources": [source], "connectors": []}))
    specs = {
        "all": spec_of({"config": str(config)}),
        "b": spec_of({"config": str(config), "collections": "public:b"}),
        "updates": spec_of({"config": str(config), "actions": "update,delete,truncate"}),
    }

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(txns=st.lists(st.lists(_op, min_size=1, max_size=6), min_size=1, max_size=8),
           truncate=st.booleans(), cut=st.integers(0, 40))  # fmt: skip
    def check(txns: list[list[tuple[str, int, str | None, bool]]], truncate: bool,
              cut: int) -> None:  # fmt: skip
        _apply(table, txns, truncate)
        with psycopg.connect(table, autocommit=True) as conn:  # stored once a later one is
            made = conn.execute("INSERT INTO m DEFAULT VALUES RETURNING id").fetchone()
            mark = str(made[0] if made else None)
        wait_for(lambda: any(e["collection_id"] == "public:m" and e["record_id"] == mark
                             for e in stored.events(table)), what="the changes stored")  # fmt: skip
        head = _head(table)
        for name, spec in specs.items():
            whole = _row_path(spec, Bucket(0, head, 0, 1))
            assert _columnar(spec, Bucket(0, head, 0, 1)) == whole, name
            for of in (2, 5):
                buckets = [_columnar(spec, Bucket(0, head, i, of)) for i in range(of)]
                assert sorted((r for b in buckets for r in b), key=lambda r: r["seq"]) == whole
                assert buckets == [_row_path(spec, Bucket(0, head, i, of)) for i in range(of)]
            middle = min(cut, head)  # seq ranges cut stored batches anywhere
            assert [*_columnar(spec, Bucket(0, middle, 0, 1)),
                    *_columnar(spec, Bucket(middle, head, 0, 1))] == whole, name  # fmt: skip

    with serving(load_config(config)):
        check()
