"""The ``schema`` option's types (spark/typed.py, docs/spark.md “Typed columns”): a type the read
cannot return is refused on the driver, naming the field and what to write instead."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql.types import (
    ArrayType,
    CharType,
    DayTimeIntervalType,
    StringType,
    StructField,
    StructType,
    VarcharType,
    YearMonthIntervalType,
)

from spark.typed import Misfit, SourceError, converter, typed_fields

ENVELOPE = ["seq", "record"]


def _refusal(t: object) -> str:
    schema = StructType([StructField("seq", StringType()), StructField("record", StringType()),
                         StructField("code", t)])  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(SourceError) as e:
        typed_fields(schema, ENVELOPE, SourceError)
    return str(e.value)


def test_char_and_varchar_are_refused_naming_string_and_other_types_list_what_is_taken() -> None:
    # PySpark's own read worker cannot make Arrow of such a schema: the query failed with a
    # traceback from inside PySpark after the reader was made.
    assert _refusal(VarcharType(5)) == (
        'option "schema": field code VARCHAR(5): write STRING for VARCHAR(5) (PySpark\'s '
        "Python data sources cannot return CHAR or VARCHAR columns)"
    )
    assert "write STRING for CHAR(2)" in _refusal(ArrayType(CharType(2)))
    assert _refusal(YearMonthIntervalType()).startswith(
        'option "schema": field code INTERVAL YEAR TO MONTH: INTERVAL YEAR TO MONTH is not '
        "supported (BOOLEAN, TINYINT to BIGINT,"
    )


@pytest.mark.parametrize(("text", "want"), [
    ("PT0S", dt.timedelta(0)),
    ("P1DT2H3M4.5S", dt.timedelta(days=1, hours=2, minutes=3, seconds=4.5)),
    ("PT-1H-2M-3.000001S", -dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=1)),
    ("P-3DT4H", dt.timedelta(days=-3, hours=4)),  # each part its own sign, as Postgres writes
    ("PT1234567.123456S", dt.timedelta(seconds=1234567, microseconds=123456)),
    ("P1Y", "an interval of years or months"), ("P0Y-2M", "an interval of years or months"),
    ("1 day", "not an ISO 8601 interval"), ("P", "not an ISO 8601 interval"),
    ("P999999999999D", "beyond the range of an interval"),
])  # fmt: skip
def test_a_day_time_interval_is_read_from_postgres_iso_8601_text(
    text: str, want: dt.timedelta | str
) -> None:
    conv = converter(DayTimeIntervalType())
    if isinstance(want, str):
        with pytest.raises(Misfit, match=want):
            conv(text)
    else:
        assert conv(text) == want
