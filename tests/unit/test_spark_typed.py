"""The ``schema`` option's types (spark/typed.py, docs/spark.md “Typed columns”): a type the read
cannot return is refused on the driver, naming the field and what to write instead."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    CharType,
    DayTimeIntervalType,
    StringType,
    StructField,
    StructType,
    VarcharType,
)

from spark.typed import SourceError, typed_fields

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
    assert _refusal(DayTimeIntervalType()).startswith(
        'option "schema": field code INTERVAL DAY TO SECOND: INTERVAL DAY TO SECOND is not '
        "supported (BOOLEAN, TINYINT to BIGINT,"
    )
