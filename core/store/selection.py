"""Message selection: collection and record id patterns, actions and column filters
(docs/configuration.md “Filters”), compiled once into a Python predicate over a stream entry.

One place for it: connectors and the Consume API select messages with it. A column filter
reads the record's JSON with exact numbers (as jsonb does): a missing field is null, and values
compare as jsonb compares them, numbers by value, text by code point (jsonb: by the store
database's collation, the same for the C collation), and never across types.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from core.config.connector import Action, Filter
from core.ids import escaped

# A record holds JSON nested up to 1000 deep (core/sources/pg/values.py); reading it with exact
# numbers, comparing or writing it recurses about once a level, beyond the default limit (1000).
sys.setrecursionlimit(max(sys.getrecursionlimit(), 4000))

Test = Callable[[dict[str, Any]], bool]
_MISSING = object()
_JTYPES = (
    (bool, "boolean"),
    ((int, Decimal), "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def glob(
    patterns: Sequence[str], form: Callable[[str], str] | None = None
) -> Callable[[str], bool] | None:
    """A matcher of ``*`` patterns (``*`` any text, everything else literal); None for all.
    ``form``: how the texts matched write what a pattern may give as written (record ids are
    subject tokens: ``a.b`` is kept as ``a%2Eb``); a piece matches either way."""
    if "*" in patterns:
        return None

    def piece(p: str) -> str:
        alt = form(p) if form is not None else p
        return re.escape(p) if alt == p else f"(?:{re.escape(p)}|{re.escape(alt)})"

    rx = re.compile("|".join(".*".join(map(piece, p.split("*"))) for p in patterns), re.S)
    return lambda text: rx.fullmatch(text) is not None


def parse(text: bytes) -> Any:
    """JSON with exact numbers (as jsonb reads it)."""
    return json.loads(text, parse_float=Decimal)


def jtype(v: Any) -> str:
    if v is None:
        return "null"
    return next(name for kinds, name in _JTYPES if isinstance(v, kinds))


def same(a: Any, b: Any) -> bool:
    """jsonb equality: of one type, numbers by value, arrays and objects item by item."""
    ta = jtype(a)
    if ta != jtype(b):
        return False
    if ta == "array":
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if ta == "object":
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def jsonb_text(v: Any) -> str:
    """``(v::jsonb)::text``: how Postgres writes a JSON value it parsed (keys of an object by
    length, then bytes; numbers as numeric writes them)."""
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, str):
        return _jsonb_string(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Decimal):
        text = format(v, "f")
        return text[1:] if v.is_zero() and text.startswith("-") else text
    if isinstance(v, list):
        return "[" + ", ".join(map(jsonb_text, v)) + "]"
    keys = sorted(v, key=lambda k: (len(k.encode()), k.encode()))
    return "{" + ", ".join(f"{_jsonb_string(k)}: {jsonb_text(v[k])}" for k in keys) + "}"


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
_CONTROL = re.compile(r'["\\\x00-\x1f]')


def _jsonb_string(s: str) -> str:
    return '"' + _CONTROL.sub(lambda m: _ESCAPES.get(m[0]) or f"\\u{ord(m[0]):04x}", s) + '"'


def _like(pattern: str) -> re.Pattern[str]:
    """SQL LIKE (``%``, ``_``, ``\\`` escapes the next character) as a regex."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.S)


def _test(f: Filter) -> Test:
    """One filter over a record's parsed fields."""
    col = f.column
    if f.op == "is_null":
        return lambda r: r.get(col) is None
    if f.op == "is_not_null":
        return lambda r: r.get(col) is not None
    if f.op == "like":
        rx = _like(f.value)

        def like(r: dict[str, Any]) -> bool:
            v = r.get(col)
            return (
                v is not None
                and rx.fullmatch(v if isinstance(v, str) else jsonb_text(v)) is not None
            )

        return like
    value = parse(json.dumps(f.value).encode())  # the value as JSON, exact
    if f.op in ("in", "not_in"):
        inside = f.op == "in"
        if not value:  # as SQL's ``= ANY`` and ``<> ALL`` of no values: never, always
            return lambda r: not inside
        return lambda r: (
            (v := r.get(col, _MISSING)) is not _MISSING
            and (any(same(v, x) for x in value) is inside)
        )
    kind = jtype(value)
    compare: Callable[[Any, Any], bool] = {
        "=": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }[f.op]
    return lambda r: (
        (v := r.get(col, _MISSING)) is not _MISSING and jtype(v) == kind and bool(compare(v, value))
    )


class Selection:
    """Which messages a connector or consumer takes: ``collections`` and ``record_ids`` are
    ``*`` patterns, ``actions`` the events' actions (None: all), ``filters`` on the record."""

    def __init__(
        self,
        collections: Sequence[str] = ("*",),
        actions: Sequence[Action] | None = None,
        filters: Sequence[Filter] = (),
        record_ids: Sequence[str] = ("*",),
    ) -> None:
        self._collection = glob(collections)
        self._record = glob(record_ids, escaped)  # a record id is kept in its token form
        self._actions = None if actions is None else frozenset(actions)
        self._tests = [_test(f) for f in filters]
        self._collections: dict[str, bool] = {}
        self.everything = not self._tests and all(
            x is None for x in (self._collection, self._record, self._actions)
        )

    def __call__(self, coll: str, rid: str | None, action: str, record: bytes | None) -> bool:
        if self.everything:
            return True
        if self._collection is not None:
            ok = self._collections.get(coll)
            if ok is None:
                ok = self._collections[coll] = self._collection(coll)
            if not ok:
                return False
        if self._actions is not None and action not in self._actions:
            return False
        if self._record is not None and (rid is None or not self._record(rid)):
            return False
        if self._tests:
            fields = parse(record) if record else {}
            if not isinstance(fields, dict):
                fields = {}
            return all(t(fields) for t in self._tests)
        return True


def selection(
    collections: Sequence[str],
    actions: Sequence[Action] | None,
    filters: Sequence[Filter],
    record_ids: Sequence[str] = ("*",),
) -> Selection:
    return Selection(collections, actions, filters, record_ids)
