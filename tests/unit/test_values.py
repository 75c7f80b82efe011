"""Column text to JSON values, as docs/design.md “Values” documents them."""

from __future__ import annotations

import json
import pickle
from datetime import datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from core.envelope import RawJson, dumps
from core.sources.http import IngestRecord
from core.sources.pg import values as v
from core.sources.pg.encoding import SourceText
from core.sources.pg.values import TypeCatalog, parse_array
from core.steps.payload import dump


def test_scalars() -> None:
    assert v.to_bool(b"t") is True and v.to_bool(b"f") is False
    assert v.to_float(b"1.5") == 1.5
    assert v.to_float(b"-Infinity") == "-Infinity"
    assert v.to_bytea(b"\\x00ff") == "AP8="
    assert v.to_timestamptz(b"2026-11-22 10:00:00+00") == "2026-11-22T10:00:00.000000Z"
    assert v.to_timestamptz(b"2026-11-22 10:00:00.5+00") == "2026-11-22T10:00:00.500000Z"
    assert v.to_timestamptz(b"infinity") == "infinity"
    assert v.to_timestamp(b"0044-03-15 12:00:00 BC") == "0044-03-15 12:00:00 BC"
    assert v.to_timestamp(b"12026-01-01 00:00:00.000001") == "12026-01-01T00:00:00.000001"


@given(st.datetimes(), st.booleans())
def test_timestamps_read_as_iso_8601_with_microseconds(at: datetime, with_zone: bool) -> None:
    """Whatever Postgres prints (it drops trailing zeros of the fraction, and the fraction
    when it is zero), a timestamp reads as ``YYYY-MM-DDTHH:MM:SS.ffffff`` (UTC: ``Z``)."""
    day = f"{at.year:04d}-{at.month:02d}-{at.day:02d}"
    fraction = f"{at.microsecond:06d}"
    printed = f"{day} {at:%H:%M:%S}" + ("." + fraction.rstrip("0") if at.microsecond else "")
    expected = f"{day}T{at:%H:%M:%S}.{fraction}"
    if with_zone:
        assert v.to_timestamptz((printed + "+00").encode()) == expected + "Z"
    else:
        assert v.to_timestamp(printed.encode()) == expected


def test_catalog_resolves_domains_and_arrays() -> None:
    # (oid, typtype, element, base, delimiter, is_array)
    cat = TypeCatalog(
        [
            (1007, "b", 23, 0, ",", True),
            (30000, "d", 0, 23, ",", False),
            (30001, "b", 30000, 0, ",", True),
            (1020, "b", 603, 0, ";", True),
        ]
    )
    assert cat.converter(30000)(b"5") == 5
    assert cat.converter(30001)(b"{1,2}") == [1, 2]
    assert cat.converter(1020)(b"{(1,1),(0,0);(2,2),(1,1)}") == ["(1,1),(0,0)", "(2,2),(1,1)"]
    assert cat.converter(99999)(b"opaque") == "opaque"  # unknown: the text, never a guess


def _literal(items: list[str | None]) -> str:
    def one(s: str | None) -> str:
        if s is None:
            return "NULL"
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "{" + ",".join(one(s) for s in items) + "}"


@given(st.lists(st.one_of(st.none(), st.text(max_size=20)), max_size=20))
def test_text_arrays_round_trip(items: list[str | None]) -> None:
    assert parse_array(_literal(items), v.to_text) == items


def test_nested_and_bounded_arrays() -> None:
    assert parse_array("{{1,2},{3,NULL}}", int) == [[1, 2], [3, None]]
    assert parse_array("[0:1]={7,8}", int) == [7, 8]
    assert parse_array("{}", int) == []


def test_copy_text_lines_split_into_the_column_text_pgoutput_would_send() -> None:
    from core.sources.pg.copy_out import split_copy_line

    assert split_copy_line(b"1\tplain\t\\N\n") == [b"1", b"plain", None]
    assert split_copy_line(b"a\\tb\t\\\\N\tx\\ny\\\\z\t\\r\\b\\f\\v\n") == [
        b"a\tb",
        b"\\N",
        b"x\ny\\z",
        b"\r\b\f\v",
    ]


def test_json_passes_through_digit_for_digit_or_as_its_text() -> None:
    """docs/design.md “Values”: json/jsonb keep every digit; JSON that parsers refuse arrives as a
    string holding the Postgres text. The store keeps JSON as text, so what only jsonb refused
    (``\\u0000``, a scale beyond numeric's) passes as it is."""
    assert dumps({"j": v.to_json(b'{"n": 123456789012345678901234567890}')}) == (
        b'{"j":{"n": 123456789012345678901234567890}}'
    )
    for refused in (b'{"a": 1e400}', b"[" * 251 + b"]" * 251, b'["\\ud800"]'):
        assert v.to_json(refused) == refused.decode()
    for kept in (
        b'{"a": "\\u0000"}',
        b'{"tiny": 1e-16384}',
        b'"a\\\\u0000"',
        b"[" * 250 + b"]" * 250,
    ):
        assert v.to_json(kept) == RawJson(kept)


def test_json_kept_as_json_is_read_by_every_parser_in_every_envelope() -> None:
    """A value nested as deep as capture keeps it, in a webhook's body (the deepest envelope),
    is read by Python's json from a subscriber 300 frames deep at the default recursion limit,
    and written again by orjson as steps do (json kept 1000 deep reached subscribers whose
    parser stopped at 1000: Python's and Jackson's)."""
    deepest = b"[" * v.MAX_DEPTH + b"]" * v.MAX_DEPTH
    assert v.to_json(deepest) == RawJson(deepest)
    body = b'{"data":[' + dumps({"record": {"c": v.to_json(deepest)}}) + b"]}"

    def parse(frames: int) -> object:
        return parse(frames - 1) if frames else json.loads(body)

    parsed = parse(300)
    assert orjson.loads(orjson.dumps(parsed["data"][0])) == parsed["data"][0]  # type: ignore[index]


def test_text_in_other_encodings_reads_as_the_server_converts_it() -> None:
    """Each character as the server converts it (asked once), split by the encoding's byte
    rules; a value holding one the server converts to nothing arrives as its bytes (Latin-1)."""
    server = {b"\xa3\xc1": "\uff21", b"\xad\xa1": "①", b"\x8e\xb1": "ｱ", b"\x8f\xb0\xa1": "丂",
              b"\xa9\xa1": None}  # EUC_JP, as Postgres 16 converts it  # fmt: skip
    asked: list[list[bytes]] = []

    def learn(encoding: str, chars: list[bytes]) -> list[str | None]:
        assert encoding == "EUC_JP"
        asked.append(chars)
        return [server[c] for c in chars]

    text = SourceText("EUC_JP", -1, learn)
    assert text(b"x\xa3\xc1\xad\xa1\x8e\xb1\x8f\xb0\xa1\t") == "x\uff21①ｱ丂\t"
    assert text(b"\xad\xa1\xad\xa1") == "①①" and len(asked) == 1  # known now
    assert text(b"\xa3\xc1\xa9\xa1") == "\xa3\xc1\xa9\xa1"  # the bytes, as Latin-1
    assert text(b"plain") == "plain" and len(asked) == 2
    cat = TypeCatalog([(1009, "b", 25, 0, ",", True)], text)
    assert cat.converter(25)(b"\xad\xa1") == "①"
    assert cat.converter(1009)(b'{"\xad\xa1",x}') == ["①", "x"]  # text[]
    assert cat.converter(3802)(b'{"\xad\xa1": 1}') == RawJson('{"①": 1}'.encode())
    assert pickle.loads(pickle.dumps(text))(b"\xad\xa1") == "①"  # a Spark task's: known
    win1252 = SourceText("WIN1252", -1, lambda _, cs: [{b"\x80": "€", b"\xe9": "é"}.get(c)
                                                         for c in cs])  # fmt: skip
    assert win1252(b"\x80 \xe9") == "€ é" and win1252(b"\xe9\x81") == "\xe9\x81"
    sql_ascii = SourceText("SQL_ASCII")  # no repertoire: UTF-8, else the bytes
    assert sql_ascii("é".encode()) == "é" and sql_ascii(b"\xe9x") == "\xe9x"


def test_ingest_takes_data_nested_as_deep_as_capture_keeps_json() -> None:
    """A pushed record's values nest as deep as a captured one's (MAX_DEPTH), no deeper: one
    nested deeper reached steps, which could not write it again."""
    deep = [[]]
    for _ in range(v.MAX_DEPTH - 2):
        deep = [deep]
    IngestRecord(collection_id="c", record_id="1", data={"x": deep})
    with pytest.raises(ValidationError, match=f"at most {v.MAX_DEPTH + 1} levels deep"):
        IngestRecord(collection_id="c", record_id="1", data={"x": [deep]})
    assert dump({"record": {"x": deep}, "metadata": {}}) == dumps({"record": {"x": deep},
                                                                  "metadata": {}})  # fmt: skip
