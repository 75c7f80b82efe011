"""Generated hostile ingest bodies against a live ``weir run`` (docs/consume-api.md): every push
is either taken, its ``data`` stored as a JSON parser reads it (an integer exactly, a fraction
as a double, a key given twice keeping its last value), or refused with a 422 that names what
(``NaN``, ``Infinity``, numbers beyond a double or underflowing to 0, integers beyond 64 bits,
lone surrogates, bytes that are not UTF-8, nesting deeper than 251 levels). Never a 500, never
another value, never a refusal of what a parser reads."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import stored
from tests.helpers.api import api_serving

MAX_LEVELS = 251  # data and its values, as capture keeps JSON
_ids = itertools.count()


class Refused(Exception):
    """What the docs say a push is refused for."""


def _number(text: str) -> Any:
    """A JSON number as the docs say it is read, or :class:`Refused`."""
    if not any(c in text for c in ".eE"):
        n = int(text)
        if not -(2**63) <= n < 2**64:
            raise Refused("beyond 64 bits")
        return n
    f = float(text)
    if math.isinf(f):
        raise Refused("beyond a double")
    if f == 0 and any(c in "123456789" for c in text.lower().split("e")[0]):
        raise Refused("underflows to 0")
    return f


def _no_surrogate(v: Any) -> None:
    if isinstance(v, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in v):
        raise Refused("lone surrogate")
    if isinstance(v, dict):
        for k, x in v.items():
            _no_surrogate(k)
            _no_surrogate(x)
    elif isinstance(v, list):
        for x in v:
            _no_surrogate(x)


def _levels(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((_levels(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_levels(x) for x in v), default=0)
    return 0


def expected(data: bytes) -> Any:
    """``data`` as the docs say it is stored, or :class:`Refused`."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise Refused("not UTF-8") from None

    def constant(name: str) -> Any:
        raise Refused(name)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        for k, v in items:  # a value a key given again replaces was read too: no parser takes it
            _no_surrogate(k)
            _no_surrogate(v)
        return dict(items)

    value = json.loads(text, parse_int=_number, parse_float=_number, parse_constant=constant,
                       object_pairs_hook=pairs)  # fmt: skip
    _no_surrogate(value)
    if _levels(value) > MAX_LEVELS:
        raise Refused("too deep")
    return value


# Numbers at and past every edge the docs name, and as generated.
EDGES = ["1e400", "-1e400", "1E-400", "-2.5e-324", "4.9e-324", "1.7976931348623157e308",
         "1.7976931348623159e308", "0.1000000000000000000001", "-0", "-0.0", "0e0", "0.0e-999",
         "9223372036854775807", "-9223372036854775808", "-9223372036854775809",
         "18446744073709551615", "18446744073709551616", "123456789012345678901234567890",
         "1.00000000000000000000000000000001", "NaN", "Infinity", "-Infinity", "1E+2"]  # fmt: skip
_NUMBERS = st.one_of(
    st.sampled_from(EDGES),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
# JSON escapes that read as a lone surrogate, a pair, NUL, controls; raw bytes not UTF-8.
ESCAPES = ["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\ude00\\ud83d", "\\u0000", "\\u001f",
           "\\/", "\\\\", '\\"', "\\n", "\\uFFFE"]  # fmt: skip
_RAW = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"])


@st.composite
def _string(draw: st.DrawFn) -> bytes:
    parts: list[bytes] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 9))
        if kind < 6:
            text = draw(st.text(max_size=8))
            parts.append(json.dumps(text, ensure_ascii=draw(st.booleans()))[1:-1]
                         .encode("utf-8", "surrogatepass"))  # fmt: skip
        elif kind < 9:
            parts.append(draw(st.sampled_from(ESCAPES)).encode())
        else:
            parts.append(draw(_RAW))
    return b'"' + b"".join(parts) + b'"'


def _atom() -> st.SearchStrategy[bytes]:
    return st.one_of(
        _NUMBERS.map(str.encode), _string(), st.sampled_from([b"true", b"false", b"null"])
    )


def _object(kids: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    keys = st.one_of(_string(), st.sampled_from([b'"a"', b'"a"', b'""']))  # keys given twice
    pairs = st.lists(st.tuples(keys, kids), max_size=4)
    return pairs.map(lambda ps: b"{" + b", ".join(k + b": " + v for k, v in ps) + b"}")


def _value() -> st.SearchStrategy[bytes]:
    return st.recursive(
        _atom(),
        lambda kids: (
            st.lists(kids, max_size=4).map(lambda xs: b"[" + b",".join(xs) + b"]") | _object(kids)
        ),
        max_leaves=12,
    )


@st.composite
def data_texts(draw: st.DrawFn) -> bytes:
    """A ``data`` object's JSON text: hostile atoms in generated shapes, sometimes nested to
    about the deepest the docs allow."""
    inner = draw(_object(_value()))
    if draw(st.integers(0, 7)) == 0:
        depth = draw(st.integers(MAX_LEVELS - 3, MAX_LEVELS + 2))
        inner = b'{"deep": ' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"
    return inner


def test_a_pushed_record_is_stored_as_a_parser_reads_it_or_refused_naming_why(
    db_url: str,
) -> None:
    seen: Counter[str] = Counter()
    with api_serving(db_url) as client:

        @settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(data_texts())
        def push(data: bytes) -> None:
            rid = f"r{next(_ids)}"
            body = b'{"records": [{"collection_id": "c", "record_id": "%s", "data": %s}]}' % (
                rid.encode(),
                data,
            )
            try:
                want, why = expected(data), None
            except Refused as e:
                want, why = None, str(e)
            r = client.post("/v1/sources/stripe/records", content=body,
                            headers={"content-type": "application/json"})  # fmt: skip
            said = f"{data[:300]!r} ({why or 'takeable'}): {r.status_code} {r.text[:300]}"
            seen[why or "taken"] += 1
            if why is not None:
                assert r.status_code == 422, said
                assert _names_where(r), said
                return
            assert r.status_code == 200 and r.json() == {"accepted": 1, "skipped": 0}, said
            got = stored.record(db_url, "c", rid)
            assert got is not None, said
            assert _same(got["record"], want), f"{said}: stored {got['record_json'][:300]}"

        push()
    assert seen["taken"] >= 30 and sum(seen.values()) - seen["taken"] >= 30, seen


def _names_where(r: httpx.Response) -> bool:
    """A 422 names the place of what is wrong: FastAPI's ``loc``, or Weir's own words."""
    detail = r.json().get("detail")
    if isinstance(detail, list):
        return all(d.get("loc") and d.get("msg") for d in detail)
    return isinstance(detail, str) and bool(detail)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: numbers by value and kind (an integer is not a double)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
