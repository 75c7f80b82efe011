"""Column text (as pgoutput sends it) to JSON values, by PostgreSQL type (docs/design.md “Values”).

The one place that decides how a Postgres value becomes JSON, for capture, backfill and the seed
job alike. Its promise: every value comes through, losslessly, and none can stop capture.

- json/jsonb pass through as their own text (:class:`RawJson`), so numbers keep every digit.
  JSON that parsers refuse (numbers beyond the range of a double, lone surrogates, nesting
  deeper than ``MAX_DEPTH``) arrives as a string holding the Postgres text instead.
- A value whose text a converter cannot read (a type we did not foresee, an odd spelling)
  arrives as its Postgres text: ``sources.pg.relations.row_values`` falls back to the text.
- Text is what a UTF-8 client reads from the table, whatever the database's encoding, and what
  none can read arrives as its bytes, one Latin-1 character each: core/sources/pg/encoding.py
  (``SourceText``) decides it for every reader.

The replication session runs with ``TimeZone=UTC``, ``DateStyle=ISO``, ``bytea_output=hex``,
``extra_float_digits=3`` and ``IntervalStyle=iso_8601`` so that the text is predictable.
A converter is chosen once per column when a Relation message arrives; the hot path only calls it.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from core.envelope import RawJson

Converter = Callable[[bytes], Any]

# Session settings that make the text of every value predictable; every connection whose
# column text goes through these converters (capture, seed, backfill) runs with them.
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=iso_8601 "
    "-c extra_float_digits=3 -c bytea_output=hex"
)

# Built-in type OIDs (pg_type.dat); stable across PostgreSQL versions.
BOOL, BYTEA, INT8, INT2, INT4, OID = 16, 17, 20, 21, 23, 26
JSON, JSONB, FLOAT4, FLOAT8, NUMERIC = 114, 3802, 700, 701, 1700
TIMESTAMP, TIMESTAMPTZ, UUID = 1114, 1184, 2950


def to_text(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:  # only a SQL_ASCII database holds such bytes: keep each byte
        return b.decode("latin-1")


def to_bool(b: bytes) -> bool:
    return b == b"t"


_SPELLED = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_float(v: float) -> float | str:
    """A float as Weir writes it: NaN and the infinities are not JSON numbers, so they are
    strings spelled as Postgres spells them."""
    return v if math.isfinite(v) else _SPELLED[repr(v)]


def to_float(b: bytes) -> float | str:
    return json_float(float(b))


def to_json(b: bytes) -> RawJson | str:
    """json/jsonb: its own text when JSON parsers read it as it is, else the text as a string.

    orjson is the judge: it refuses numbers beyond a double's range, lone surrogates and
    nesting deeper than 1024, of which a value may take ``MAX_DEPTH``. (The store keeps the
    text as it is, so ``\\u0000`` and numbers of any scale pass.)
    """
    try:
        orjson.loads(_ENVELOPED % b if b.count(b"[") + b.count(b"{") > MAX_DEPTH else b)
    except orjson.JSONDecodeError:
        return to_text(b)
    return RawJson(b)


# Levels of nesting a json value keeps as JSON: every parser takes a message then, in any of
# Weir's envelopes (a message, a webhook's or the Consume API's body): Python's json (whose
# limit is the interpreter's recursion limit, 1000, less its caller's frames), Jackson's default
# (1000), and orjson both ways (1024 read, 254 written: steps write a message again).
MAX_DEPTH = 250
_ENVELOPED = b"[" * (1024 - MAX_DEPTH) + b"%b" + b"]" * (1024 - MAX_DEPTH)


def to_bytea(b: bytes) -> str:
    # bytea_output=hex: "\x0a0b..."
    return base64.b64encode(bytes.fromhex(b[2:].decode())).decode()


def _iso_datetime(s: str, suffix: str) -> str:
    """``2026-11-22 10:00:00.12`` -> ``2026-11-22T10:00:00.120000`` + suffix."""
    if len(s) == 19 and s[10] == " ":  # whole seconds, years 1-9999 AD: the common case
        return f"{s[:10]}T{s[11:]}.000000{suffix}"
    if s.endswith(" BC") or s[0] in "-i":  # BC dates and +-infinity stay as Postgres prints them
        return s
    day, _, time = s.partition(" ")
    if len(time) == 8:
        time += ".000000"
    elif len(time) < 15:
        time = time.ljust(15, "0")
    return f"{day}T{time}{suffix}"


def to_timestamptz(b: bytes) -> str:
    s = b.decode()
    if s.endswith("+00"):
        return _iso_datetime(s[:-3], "Z")
    return s  # infinity, or an offset we did not ask for


def to_timestamp(b: bytes) -> str:
    return _iso_datetime(b.decode(), "")


def parse_array(text: str, element: Converter, delimiter: str = ",") -> Any:
    """Postgres array literal (``{1,2,"a b",NULL,{3,4}}``) to nested lists of converted values."""
    if text.startswith("["):  # explicit bounds: [0:1]={...}
        text = text[text.index("=") + 1 :]
    pos = 0
    n = len(text)

    def parse_list() -> list[Any]:
        nonlocal pos
        assert text[pos] == "{"
        pos += 1
        items: list[Any] = []
        if text[pos] == "}":
            pos += 1
            return items
        while True:
            ch = text[pos]
            if ch == "{":
                items.append(parse_list())
            elif ch == '"':
                pos += 1
                buf = []
                while text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    buf.append(text[pos])
                    pos += 1
                pos += 1
                items.append(element("".join(buf).encode()))
            else:
                start = pos
                while pos < n and text[pos] != delimiter and text[pos] != "}":
                    pos += 1
                raw = text[start:pos]  # unquoted: nothing around it (non-ASCII spaces are its own)
                items.append(None if raw == "NULL" else element(raw.encode()))
            if text[pos] == delimiter:
                pos += 1
                continue
            assert text[pos] == "}"
            pos += 1
            return items

    return parse_list()


_BY_OID: dict[int, Converter] = {
    BOOL: to_bool,
    BYTEA: to_bytea,
    INT8: int,
    INT2: int,
    INT4: int,
    OID: int,
    JSON: to_json,
    JSONB: to_json,
    FLOAT4: to_float,
    FLOAT8: to_float,
    TIMESTAMP: to_timestamp,
    TIMESTAMPTZ: to_timestamptz,
}


@dataclass(frozen=True, slots=True)
class PgType:
    oid: int
    typtype: str  # b base, d domain, e enum, c composite, r range, m multirange
    element: int  # array element type, 0 when not an array
    base: int  # base type of a domain, 0 otherwise
    delimiter: str
    is_array: bool


# No names: a type is known by its oid (a table's row type has the table's name, which a UTF-8
# client may not read: a SQL_ASCII database's Latin-1 name stopped capture at every start).
TYPES_SQL = """
SELECT t.oid::bigint, t.typtype, t.typelem::bigint, t.typbasetype::bigint, t.typdelim,
       t.typcategory = 'A' AND t.typelem <> 0
FROM pg_type t
"""


# The same values rendered as JSON by the source server itself, for reading whole tables
# (``sources.pg.snapshot``): an SQL expression over the column ``{c}`` per type. A built-in type
# missing here is converted in Python: floats (the server prints 1 where Python prints 1.0).
# Timestamps: AD ones as _iso_datetime writes them, BC and +-infinity as text, as it keeps them.
_ISO_SQL = (
    "CASE WHEN {c} >= '0001-01-01' AND {c} < 'infinity' "
    "THEN to_char({c}, 'YYYY-MM-DD\"T\"HH24:MI:SS.US%s') ELSE {c}::text END"
)
# jsonb as to_json keeps it: itself, unless it holds a number beyond a double's range (at or
# above 2**1024 - 2**970 in size, which rounds to infinity) or nests deeper than MAX_DEPTH, then its
# text. (A jsonb cannot hold the other things to_json refuses; json can, so json columns are
# converted in Python.) Braces are doubled for sql.SQL.format.
_DOUBLE_OVERFLOW = 2**1024 - 2**970
_JSONB_SQL = (
    'CASE WHEN jsonb_path_exists({c}, \'strict $.** ? (@.type() == "number"'
    f" && (@ >= {_DOUBLE_OVERFLOW} || @ <= -{_DOUBLE_OVERFLOW}))')"
    f" OR jsonb_path_exists({{c}}, 'strict $.**{{{{{MAX_DEPTH} to last}}}}"
    ' ? (@.type() == "array" || @.type() == "object")\')'
    " THEN to_jsonb({c}::text) ELSE {c} END"
)
_SQL_BY_OID: dict[int, str] = {
    BOOL: "{c}",
    BYTEA: "translate(encode({c}, 'base64'), E'\\n', '')",  # base64 without its line breaks
    INT8: "{c}",
    INT2: "{c}",
    INT4: "{c}",
    OID: "{c}::int8",  # to_json prints an oid as a string
    JSONB: _JSONB_SQL,
    TIMESTAMP: _ISO_SQL % "",
    TIMESTAMPTZ: _ISO_SQL % '"Z"',
}
_TEXT_SQL = "{c}::text"  # every other type that is no array: its text, as a JSON string


class TypeCatalog:
    """Knows how to turn any column type of one database into JSON values.

    Loaded from ``pg_type`` by the capture process; ``refresh`` is called with a fresh row set
    when a Relation message names a type that is not known yet (a type created after start).
    ``text`` reads the database's text as the server sends it, unconverted (a
    ``core.sources.pg.encoding.SourceText``; UTF-8 by default).
    """

    def __init__(
        self, rows: list[tuple[Any, ...]] | None = None, text: Converter = to_text
    ) -> None:
        self.types: dict[int, PgType] = {}
        self._cache: dict[int, Converter] = {}
        # UTF-8 (and SQL_ASCII's bytes) need no reader of their own: to_text is the same.
        self.text = text if getattr(text, "converts", True) else to_text
        if rows:
            self.refresh(rows)

    def refresh(self, rows: list[tuple[Any, ...]]) -> None:
        self.types = {r[0]: PgType(*r) for r in rows}
        self._cache.clear()

    def knows(self, oid: int) -> bool:
        return oid in _BY_OID or oid in self.types

    def converter(self, oid: int) -> Converter:
        conv = self._cache.get(oid)
        if conv is None:
            conv = self._cache[oid] = self._build(oid, self.text)
        return conv

    def json_sql(self, oid: int) -> str | None:
        """The SQL that renders a column of this type as its converter's JSON value (``{c}``
        is the column), or None when only the converter can (floats, arrays)."""
        t = self.resolve(oid)
        if isinstance(t, PgType):
            return None
        return _SQL_BY_OID.get(t) if t in _BY_OID else _TEXT_SQL

    def resolve(self, oid: int) -> int | PgType:
        """What a column of this type converts as: a type oid with domains looked through, or
        the array type."""
        for _ in range(1000):  # domains cannot form a cycle; this only bounds a broken catalog
            t = self.types.get(oid)
            if oid in _BY_OID or t is None or not (t.typtype == "d" and t.base):
                return t if t is not None and t.is_array and oid not in _BY_OID else oid
            oid = t.base
        return oid

    def _build(self, oid: int, text: Converter) -> Converter:
        """The converter of a type whose values ``text`` decodes (array elements arrive
        decoded already, so theirs is UTF-8)."""
        t = self.resolve(oid)
        if isinstance(t, PgType):
            element = self._build(t.element, to_text)
            delimiter = t.delimiter

            def to_array(b: bytes) -> Any:
                return parse_array(text(b), element, delimiter)

            return to_array
        # numeric, uuid, text, enums, dates, times, intervals, ranges, unknown types: the text
        conv = _BY_OID.get(t, to_text)
        if text is to_text or conv not in (to_text, to_json):
            return conv  # UTF-8, or a type whose text is ASCII in every server encoding
        if conv is to_text:
            return text
        return lambda b: conv(text(b).encode())
