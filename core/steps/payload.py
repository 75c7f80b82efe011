"""Payloads as JSON with every number exact (docs/transforms.md “What steps keep”): what steps
read and write, and what an enrich step reads of its rows.

A number orjson would change (``1.10``, ``0.1000000000000000055511``, ``1e400``, ``-0``, an
integer beyond 64 bits) is read as a subclass of float or int that keeps its text: it is
written back as its own digits when no step changed it, and compares and computes by the value
its digits say (core/steps/expr.py: ``9.99 == 9.99`` whichever way it was read,
``12345678901234567890.1 < 12345678901234567890.2``).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson

from core.redact import said


class Exact(float):
    """A JSON number read as a float, with the text it was written as."""

    text: str

    def __new__(cls, text: str) -> Exact:
        made = super().__new__(cls, text)
        made.text = text
        return made


class Big(int):
    """An integer beyond 64 bits: written back as its own digits."""


def _exact_int(text: str) -> int | float:
    if text == "-0":  # written back as it came (an int would be 0)
        return Exact(text)
    n = int(text)
    return n if -(2**63) <= n < 2**64 else Big(n)


def _fragment(v: Any) -> Any:
    if isinstance(v, Exact):
        return orjson.Fragment(v.text)
    if isinstance(v, Big):
        return orjson.Fragment(str(int(v)))
    if isinstance(v, Decimal):  # a function's
        if not v.is_finite():
            raise TypeError(said("%s is no JSON number", v))
        return orjson.Fragment(str(v))
    bases: tuple[type[Any], ...] = (bool, int, float, str, dict, list)
    for base in bases:  # another subclass: as its base type
        if isinstance(v, base):
            return base(v)
    raise TypeError(said("%s is not a JSON value", type(v).__name__))


_SPACE = b" \t\n\r"


def load(payload: bytes) -> Any:
    """A payload as JSON, every number exact: orjson's reading when writing it back gives the
    same bytes but for whitespace, else the exact one.

    Whitespace is the difference in a json or jsonb column's value (Postgres writes ``{"a": 1}``)
    and never in a number: no number holds whitespace and a separator stands between any two,
    so texts equal without it hold the same numbers in the same places."""
    try:
        fast = orjson.loads(payload)
        again = orjson.dumps(fast)
        if again == payload or again.translate(None, _SPACE) == payload.translate(None, _SPACE):
            return fast
    except orjson.JSONDecodeError:
        pass
    return json.loads(payload, parse_float=Exact, parse_int=_exact_int)


def dump(msg: Any) -> bytes:
    try:
        return orjson.dumps(msg, default=_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    except orjson.JSONEncodeError as e:
        if "64-bit" not in str(e):
            raise
    # A Python int beyond 64 bits (a function's, an add's): a JSON number all the same
    return orjson.dumps(_bigs(msg), default=_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)


def _bigs(v: Any) -> Any:
    """``v`` with every int beyond 64 bits a :class:`Big` (orjson writes no such int)."""
    if type(v) is int:
        return v if -(2**63) <= v < 2**64 else Big(v)
    if type(v) is dict:
        return {k: _bigs(x) for k, x in v.items()}
    if type(v) is list:
        return [_bigs(x) for x in v]
    return v
