"""Column types and hostile values to generate, and the oracle: what docs/design.md “Values” says a
subscriber receives for a value, worked out here from Postgres's own text of it, on its own
(not with Weir's converters).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

from core.sources.pg.values import MAX_DEPTH

DOUBLE_OVERFLOW = 2**1024 - 2**970  # a JSON number this large reads as infinity


@dataclass(frozen=True)
class Kind:
    """A column type: its SQL, how its text maps to JSON, and literals to store in it."""

    sql: str
    mapping: str  # int | float | bool | json | bytea | ts | tstz | text, or array:<mapping>
    values: st.SearchStrategy[str]


_TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=40)
_ODD_TEXT = _TEXT | st.sampled_from(
    ["", " ", "None", "NULL", "%NULL", "%EMPTY", "a.b", "*", ">", "\\", '"', "{}", "é", "😀",
     "line\nbreak", "tab\there", "x" * 3000]
)  # fmt: skip
_DIGITS = st.integers(-(10**400), 10**400).map(str)
_NUMBERS = _DIGITS | st.sampled_from(
    ["1e400", "-1e400", "1e-400", "1e308", "1.7976931348623158e308", "-1.7976931348623159e308",
     "0.1000000000000000000000001", "123456789012345678901234567890", "-0", "0.0", "1E+2"]
)  # fmt: skip


def _json_texts(jsonb: bool) -> st.SearchStrategy[str]:
    leaves = _NUMBERS | st.sampled_from(["true", "false", "null"]) | _TEXT.map(json.dumps)
    nested = st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
            | st.dictionaries(_TEXT.map(json.dumps), inner, max_size=3).map(
                lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
            )
        ),
        max_leaves=8,
    )
    deep = st.sampled_from([999, 1000, 1001, 1100]).map(lambda n: "[" * n + "]" * n)
    odd = ['{"a": 1, "a": 2}', '{\n  "spaced" :\t[1 , 2]\n}', '"\\u00e9\\n"']
    if not jsonb:  # json keeps its text as written; jsonb refuses these at input
        odd += ['{"nul": "\\u0000"}', '["\\ud800"]', '"\\udfff x"', '{"k\\u0000": 1}']
    return nested | deep | st.sampled_from(odd)


def _array(items: list[Any]) -> str:
    def one(v: Any) -> str:
        if v is None:
            return "NULL"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "{" + ",".join(one(v) for v in items) + "}"


def _stamp(zone: bool) -> st.SearchStrategy[str]:
    z = "+00" if zone else ""
    return st.datetimes().map(lambda d: d.isoformat(sep=" ") + z) | st.sampled_from(
        ["infinity", "-infinity", "0044-03-15 12:00:00 BC", "294276-12-31 23:59:59.999999",
         "10000-01-01 00:00:00", "2026-11-24 10:00:00.5"]
    )  # fmt: skip


KINDS: dict[str, Kind] = {
    "int2": Kind("smallint", "int", st.integers(-(2**15), 2**15 - 1).map(str)),
    "int4": Kind("int", "int", st.integers(-(2**31), 2**31 - 1).map(str)),
    "int8": Kind("bigint", "int", st.integers(-(2**63), 2**63 - 1).map(str)),
    "oid": Kind("oid", "int", st.integers(0, 2**32 - 1).map(str)),
    "float4": Kind("real", "float", st.floats(width=32).map(repr) | st.just("-0")),
    "float8": Kind("double precision", "float", st.floats().map(repr)),
    "numeric": Kind(
        "numeric",
        "text",
        st.decimals(allow_nan=False)
        .filter(lambda d: not d.is_finite() or abs(d.adjusted()) < 900)
        .map(str)
        | st.sampled_from(
            ["NaN", "Infinity", "-Infinity", "1" + "0" * 1000, "0." + "0" * 999 + "1"]
        ),
    ),
    "bool": Kind("boolean", "bool", st.sampled_from(["t", "f"])),
    "text": Kind("text", "text", _ODD_TEXT),
    "varchar": Kind(
        "varchar(12)",
        "text",
        st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=12),
    ),
    "char": Kind("char(3)", "text", st.text("ab é", max_size=3)),
    "name": Kind("name", "text", st.text("abcé_ 1", max_size=20)),
    "bytea": Kind("bytea", "bytea", st.binary(max_size=200).map(lambda b: "\\x" + b.hex())),
    "json": Kind("json", "json", _json_texts(jsonb=False)),
    "jsonb": Kind("jsonb", "json", _json_texts(jsonb=True)),
    "timestamp": Kind("timestamp", "ts", _stamp(zone=False)),
    "timestamptz": Kind("timestamptz", "tstz", _stamp(zone=True)),
    "date": Kind(
        "date", "text", st.dates().map(str) | st.sampled_from(["infinity", "4713-01-01 BC"])
    ),
    "time": Kind("time", "text", st.times().map(str)),
    "timetz": Kind("timetz", "text", st.times().map(lambda t: f"{t}+05:30")),
    "interval": Kind(
        "interval",
        "text",
        st.sampled_from(
            ["1 day 2 hours", "-178000000 years", "00:00:00.000001", "P1Y2M3DT4H5M6S", "0"]
        ),
    ),
    "uuid": Kind("uuid", "text", st.uuids().map(str)),
    "inet": Kind("inet", "text", st.ip_addresses().map(str)),
    "cidr": Kind("cidr", "text", st.sampled_from(["10.0.0.0/8", "::/0", "192.168.1.0/24"])),
    "macaddr": Kind("macaddr", "text", st.sampled_from(["08:00:2b:01:02:03"])),
    "money": Kind("money", "text", st.sampled_from(["12.34", "-92233720368547758.08"])),
    "bit": Kind("bit varying(16)", "text", st.text("01", max_size=16)),
    "point": Kind("point", "text", st.sampled_from(["(1,2)", "(-1e300,NaN)"])),
    "box": Kind("box", "text", st.sampled_from(["(1,1),(0,0)"])),
    "polygon": Kind("polygon", "text", st.sampled_from(["((0,0),(1,1),(1,0))"])),
    "tsvector": Kind("tsvector", "text", st.sampled_from(["'a' 'fat':2 'cat':3", ""])),
    "int4range": Kind("int4range", "text", st.sampled_from(["[1,5)", "empty", "(,3]"])),
    "tstzrange": Kind("tstzrange", "text", st.sampled_from(["[2026-01-01,infinity)"])),
    "multirange": Kind("int4multirange", "text", st.sampled_from(["{[1,2),[5,9)}", "{}"])),
    "pg_lsn": Kind("pg_lsn", "text", st.sampled_from(["0/0", "FFFFFFFF/FFFFFFFF"])),
    "mood": Kind("mood", "text", st.sampled_from(["sad", 'happy, "really"', "é ünï"])),
    "posint": Kind("posint", "int", st.integers(1, 2**31 - 1).map(str)),
    "pair": Kind("pair", "text", st.sampled_from(['(1,"a b")', "(,)", '(2,"\\\\")'])),
    "int4[]": Kind(
        "int[]",
        "array:int",
        st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)), max_size=5).map(_array),
    ),
    "int4[][]": Kind(
        "int[][]",
        "array:int",
        st.sampled_from(["{{1,2},{3,NULL}}", "[0:1]={7,8}", "{}", "{{{1}},{{2}}}"]),
    ),
    "text[]": Kind(
        "text[]",
        "array:text",
        st.lists(st.one_of(st.none(), _ODD_TEXT.filter(lambda s: len(s) < 100)), max_size=5).map(
            _array
        ),
    ),
    "jsonb[]": Kind(
        "jsonb[]",
        "array:json",
        st.lists(_json_texts(jsonb=True).filter(lambda s: len(s) < 200), max_size=3).map(_array),
    ),
    "json[]": Kind(
        "json[]",
        "array:json",
        st.lists(_json_texts(jsonb=False).filter(lambda s: len(s) < 200), max_size=3).map(_array),
    ),
    "bytea[]": Kind(
        "bytea[]",
        "array:bytea",
        st.lists(st.binary(max_size=20).map(lambda b: "\\x" + b.hex()), max_size=3).map(_array),
    ),
    "tstz[]": Kind(
        "timestamptz[]", "array:tstz", st.lists(_stamp(zone=True), max_size=3).map(_array)
    ),
    "float8[]": Kind(
        "double precision[]", "array:float", st.lists(st.floats().map(repr), max_size=3).map(_array)
    ),
    "box[]": Kind("box[]", "array:text", st.sampled_from(["{(1,1),(0,0);(2,2),(1,1)}"])),
    "posint[]": Kind("posint[]", "array:int", st.sampled_from(["{1,2}", "{}"])),
    "mood[]": Kind("mood[]", "array:text", st.sampled_from(['{sad,"happy, \\"really\\""}'])),
    "pair[]": Kind("pair[]", "array:text", st.sampled_from(['{"(1,\\"a b\\")",NULL}'])),
}

# The user types the kinds above need, made once per database.
TYPES_DDL = (
    "CREATE TYPE mood AS ENUM ('sad', 'happy, \"really\"', 'é ünï')",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    "CREATE TYPE pair AS (n int, s text)",
)


# -- the oracle -------------------------------------------------------------------------------


def _portable(value: Any) -> bool:
    """Whether JSON parsers take this parsed json value as it is (docs/design.md “Values”)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                return False
            items = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
            for k, x in items:
                if k is not None and not _clean(k):
                    return False
                stack.append((x, depth + 1))
        elif (isinstance(v, str) and not _clean(v)) or (
            isinstance(v, (int, Decimal)) and not isinstance(v, bool) and abs(v) >= DOUBLE_OVERFLOW
        ):
            return False
    return True


def _clean(s: str) -> bool:
    """No lone surrogate (parsers refuse one); NUL is JSON's like any character."""
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in s)


def exact_json(text: str | bytes) -> Any:
    """JSON parsed with every digit kept (numbers as int or Decimal)."""
    return json.loads(text, parse_float=Decimal)


def expected(mapping: str, text: str | None) -> Any:
    """What a subscriber receives for a value whose Postgres text is ``text``."""
    if text is None:
        return None
    if mapping == "int":
        return int(text)
    if mapping == "float":
        f = float(text)
        return Decimal(repr(f)) if f == f and abs(f) != float("inf") else text
    if mapping == "bool":
        return text in ("t", "true")  # the output function prints t, a cast to text true
    if mapping == "bytea":
        return base64.b64encode(bytes.fromhex(text[2:])).decode()
    if mapping == "json":
        try:
            parsed = exact_json(text)
        except RecursionError:
            return text  # deeper than Python's own parser goes: far beyond MAX_DEPTH
        return parsed if _portable(parsed) else text
    if mapping in ("ts", "tstz"):
        return _iso(text, "Z" if mapping == "tstz" else "")
    return text


def _iso(text: str, zone: str) -> str:
    """``2026-11-22 10:00:00.5+00`` -> ``2026-11-22T10:00:00.500000Z``; BC and infinities stay."""
    if text.endswith(" BC") or text in ("infinity", "-infinity"):
        return text
    if zone:
        text = text.removesuffix("+00")
    day, _, time = text.partition(" ")
    whole, _, fraction = time.partition(".")
    return f"{day}T{whole}.{fraction.ljust(6, '0')}{zone}"
