"""Payloads as JSON with every number exact (docs/transforms.md “What steps keep”): what steps
read and write, and what an enrich step reads of its rows."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import orjson


class _Big(int):
    """An integer beyond 64 bits: written back as its own digits."""


def _exact_int(text: str) -> int:
    n = int(text)
    return n if -(2**63) <= n < 2**64 else _Big(n)


def _fragment(v: Any) -> Any:
    if isinstance(v, (Decimal, _Big)):
        return orjson.Fragment(str(int(v)) if isinstance(v, _Big) else str(v))
    raise TypeError(f"{type(v).__name__} is not a JSON value")


def load(payload: bytes, exact: bool = True) -> Any:
    """A payload as JSON, every number exact: orjson's reading when writing it back gives the
    same bytes (Weir's own payloads), else (a json column's ``1.10``, a 30-digit number) the
    exact one. ``exact=False``: orjson's reading, when it can (read, not written back)."""
    try:
        fast = orjson.loads(payload)
        if not exact or orjson.dumps(fast) == payload:
            return fast
    except orjson.JSONDecodeError:
        pass
    return json.loads(payload, parse_float=Decimal, parse_int=_exact_int)


def dump(msg: Any) -> bytes:
    return orjson.dumps(msg, default=_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
