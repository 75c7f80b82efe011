"""Column filters, now run in Python on the stored JSON (core/store/selection.py), select what
the SQL over jsonb selected before (the oracle below is that SQL, run by Postgres), for
generated records and filters: numbers by value, never across types, a missing field null."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.config.connector import Filter
from core.envelope import RawJson, dumps
from core.store.selection import Selection, jsonb_text, parse

COMPARE = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
COLUMNS = ["a", "b", "c"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-1000, max_value=1000),
    st.sampled_from(["", "a", "A", "b", "ab", "a%", "é", "1", "true", "null", "2026-11-22"]),
)  # fmt: skip
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(["x", "yy", "z"]), inner, max_size=3),
                      max_leaves=6)  # fmt: skip
# What YAML gives a filter: numbers as int or float.
yaml_scalars = st.one_of(
    st.booleans(), st.integers(-(10**20), 10**20), st.floats(-1000, 1000, width=32),
    st.sampled_from(["", "a", "A", "b", "ab", "é", "1", "true", "null", "2026-11-22"]),
)  # fmt: skip
yaml_values = st.recursive(yaml_scalars | st.none(), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(["x", "yy"]), inner, max_size=3),
                           max_leaves=5)  # fmt: skip
filters = st.one_of(
    st.builds(lambda c, op, v: Filter(column=c, op=op, value=v), st.sampled_from(COLUMNS),
              st.sampled_from(list(COMPARE)), yaml_scalars),
    st.builds(lambda c, op, v: Filter(column=c, op=op, value=v), st.sampled_from(COLUMNS),
              st.sampled_from(["in", "not_in"]), st.lists(yaml_values, max_size=3)),
    st.builds(lambda c, op: Filter(column=c, op=op), st.sampled_from(COLUMNS),
              st.sampled_from(["is_null", "is_not_null"])),
    st.builds(lambda c, v: Filter(column=c, op="like", value=v), st.sampled_from(COLUMNS),
              st.sampled_from(["a%", "%b", "_", "%", "1%", "t%", "a\\%", "%é%", "{%"])),
)  # fmt: skip


def _json(v: Any) -> Any:
    """Numbers as the JSON text capture keeps exact ones in."""
    if isinstance(v, Decimal) or (isinstance(v, int) and not isinstance(v, bool)):
        return RawJson(str(v).encode())
    if isinstance(v, list):
        return [_json(x) for x in v]
    if isinstance(v, dict):
        return {k: _json(x) for k, x in v.items()}
    return v


def oracle(f: Filter) -> tuple[str, list[Any]]:
    """The SQL condition over ``r`` (jsonb) that selected a message before."""
    field = f"(r -> '{f.column}')"
    if f.op == "is_null":
        return f"coalesce({field} = 'null'::jsonb, true)", []
    if f.op == "is_not_null":
        return f"coalesce({field} <> 'null'::jsonb, false)", []
    if f.op == "like":
        return f"coalesce((r ->> '{f.column}') LIKE %s, false)", [f.value]
    if f.op in ("in", "not_in"):
        test = "= ANY" if f.op == "in" else "<> ALL"
        return f"coalesce({field} {test}(%s::jsonb[]), false)", [[json.dumps(v) for v in f.value]]
    value = json.dumps(f.value)
    return (f"coalesce(jsonb_typeof({field}) = jsonb_typeof(%s::jsonb) AND {field} "
            f"{COMPARE[f.op]} %s::jsonb, false)"), [value, value]  # fmt: skip


def test_filters_select_as_jsonb_did(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:

        @settings(max_examples=300, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
        @given(st.dictionaries(st.sampled_from(COLUMNS), values, max_size=3), st.lists(
            filters, min_size=1, max_size=2))  # fmt: skip
        def check(record: dict[str, Any], chosen: list[Filter]) -> None:
            text = dumps(_json(record))
            clauses = [oracle(f) for f in chosen]
            where = " AND ".join(c for c, _ in clauses)
            params = [p for _, ps in clauses for p in ps]
            query = f"SELECT {where} FROM (SELECT %s::jsonb AS r) q"
            row = conn.execute(query, [*params, text.decode()]).fetchone()
            assert row is not None
            got = Selection(filters=chosen)("c", "1", "insert", text)
            assert got is row[0], (text, chosen)

        check()


def test_jsonb_text_is_how_postgres_writes_a_parsed_value(db_url: str) -> None:
    """The queue group key of a consumer's ``group_columns`` is jsonb's text of the values."""
    with psycopg.connect(db_url, autocommit=True) as conn:

        @settings(max_examples=200, deadline=None)
        @given(values)
        def check(value: Any) -> None:
            text = dumps(_json(value)).decode()
            row = conn.execute("SELECT (%s::jsonb)::text", (text,)).fetchone()
            assert row is not None
            assert jsonb_text(parse(text.encode())) == row[0]

        check()


def test_values_nested_as_deep_as_capture_keeps_them(db_url: str) -> None:
    """Capture keeps JSON nested up to 1000 deep as JSON: a filter reads such a record (it
    stopped every filtered connector for good with a RecursionError)."""
    deep = "[" * 1000 + "]" * 1000
    text = b'{"a": ' + deep.encode() + b', "b": 1}'
    chosen = [
        [Filter(column="b", op="=", value=1)],
        [Filter(column="a", op="is_not_null")],
        [Filter(column="a", op="in", value=[[[]], 1])],
        [Filter(column="a", op="like", value="[[%")],
    ]
    with psycopg.connect(db_url, autocommit=True) as conn:
        for filters in chosen:
            clauses = [oracle(f) for f in filters]
            query = f"SELECT {clauses[0][0]} FROM (SELECT %s::jsonb AS r) q"
            row = conn.execute(query, [*clauses[0][1], text.decode()]).fetchone()
            assert row is not None
            assert Selection(filters=filters)("c", "1", "insert", text) is row[0], filters
        row = conn.execute("SELECT (%s::jsonb)::text", (deep,)).fetchone()
        assert row is not None and jsonb_text(parse(deep.encode())) == row[0]
