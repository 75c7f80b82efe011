"""The ``schema`` option of the ``weir`` data source (docs/spark.md “Typed columns”): the
record's top-level keys as typed columns, each converted in the read task into the Arrow type
Spark expects of the schema's type.

Spark parses the option's DDL (the source's ``schema()`` is the envelope's columns and it);
:func:`typed_fields` refuses, on the driver, a type no conversion is defined for. A task parses
each page's records with orjson and converts column by column: a column whose values already
are what Arrow takes (whole numbers, text, booleans) goes to Arrow as it is, the others value
by value. Numbers keep every digit: a value orjson read as a double (a fraction, an exponent,
an integer beyond 64 bits) is read again from the record's text, exactly (``Decimal``), where
the type needs it (DECIMAL, STRING, the integers). A value that does not fit its type fails the
task naming the source, seq, record, field and types (``failfast``) or is null
(``permissive``).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import re
import struct
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from typing import Any

import orjson
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from core.envelope import iso_time

MODES = ("failfast", "permissive")
_EXACT = Context(prec=1000)  # a DECIMAL's scaling: exact for every precision Spark has
_INT = re.compile(r"-?(0|[1-9][0-9]{0,19})")  # a whole JSON number
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")  # a JSON number
_NUMBER = re.compile(_DECIMAL.pattern + "|NaN|-?Infinity")  # and the floats' other values
_DURATION = re.compile(  # an interval as Weir's capture writes it (IntervalStyle iso_8601)
    r"P(?!$)(?:(-?[0-9]+)Y)?(?:(-?[0-9]+)M)?(?:(-?[0-9]+)D)?"  # a part after P, and after T
    r"(?:T(?!$)(?:(-?[0-9]+)H)?(?:(-?[0-9]+)M)?(?:(-?[0-9]+(?:\.[0-9]+)?)S)?)?"
)
_BITS = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


class SourceError(RuntimeError):
    """The data source cannot read as asked; the message says what to do (spark/source.py)."""


class Misfit(Exception):
    """A value that does not fit its type; the argument says how."""


class _Inexact(Exception):
    """orjson read the value as a double: read the record again, exactly."""


def typed_fields(schema: StructType, envelope: list[str], error: type[Exception]) -> StructType:
    """The schema's fields after the envelope's columns, each checked: a clash with an envelope
    column, NOT NULL or a type without a conversion raises ``error``, naming field and type."""
    typed = StructType(schema.fields[len(envelope) :])
    taken = {name.lower() for name in envelope}
    for f in typed.fields:
        what = f'option "schema": field {f.name} {f.dataType.simpleString().upper()}'
        if f.name.lower() in taken:
            raise error(f"{what}: {f.name} is a column of the envelope already (read it with "
                        "from_json(record, …))")  # fmt: skip
        if not f.nullable:
            raise error(f"{what} NOT NULL: a record may lack it (every field is nullable)")
        wrong = _unsupported(f.dataType)
        if isinstance(wrong, (CharType, VarcharType)):
            raise error(f"{what}: write STRING for {wrong.simpleString().upper()} (PySpark's "
                        "Python data sources cannot return CHAR or VARCHAR columns)")  # fmt: skip
        if wrong is not None:
            raise error(f"{what}: {wrong.simpleString().upper()} is not supported (BOOLEAN, "
                        "TINYINT to BIGINT, FLOAT, DOUBLE, DECIMAL, STRING, BINARY, DATE, "
                        "TIMESTAMP, TIMESTAMP_NTZ, INTERVAL DAY TO SECOND, ARRAY, STRUCT, "
                        "MAP<STRING, …>)")  # fmt: skip
    return typed


def _unsupported(t: DataType) -> DataType | None:
    if isinstance(t, ArrayType):
        return _unsupported(t.elementType)
    if isinstance(t, StructType):
        return next((w for f in t.fields if (w := _unsupported(f.dataType))), None)
    if isinstance(t, MapType):
        if type(t.keyType) is not StringType:
            return t
        return _unsupported(t.valueType)
    return None if type(t) in _SCALARS else t


def json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float, Decimal)):
        return "number"
    names: dict[type, str] = {str: "string", dict: "object", list: "array"}
    return names.get(type(v), "null")


# -- one value ----------------------------------------------------------------------------------


def _whole(bits: int) -> Callable[[Any], Any]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)

    def whole(v: Any) -> Any:
        if type(v) is str:
            if not _INT.fullmatch(v):
                raise Misfit("not a whole number")
            v = int(v)
        elif type(v) is float:
            raise _Inexact
        elif type(v) is not int:
            raise Misfit("a fraction or an exponent" if type(v) is Decimal else "not a number")
        if not low <= v < high:
            raise Misfit("beyond its range")
        return v

    return whole


def _double(v: Any) -> Any:
    """A double: an infinity only where the value is one (``Infinity`` as Weir writes it), not
    a number beyond a double's range (``1e400``, which float() makes infinite)."""
    if type(v) in (float, int, Decimal) or (type(v) is str and _NUMBER.fullmatch(v)):
        try:
            f = float(v)
        except OverflowError:
            raise Misfit("beyond its range") from None
        if math.isinf(f) and not (type(v) is str and v.endswith("Infinity")):
            raise Misfit("beyond its range")
        return f
    raise Misfit("not a number")


def _float(v: Any) -> Any:
    """A float: what rounds to a finite one (the largest ``real`` written with its 8 digits
    does), or an infinity."""
    f = _double(v)
    if math.isinf(struct.unpack("f", struct.pack("f", f))[0]) and not math.isinf(f):
        raise Misfit("beyond its range")
    return f


def _decimal(t: DecimalType) -> Callable[[Any], Any]:
    p, s = t.precision, t.scale

    def decimal(v: Any) -> Any:
        if type(v) is float:
            raise _Inexact
        if type(v) is int or (type(v) is str and _DECIMAL.fullmatch(v)):
            v = Decimal(v)
        elif type(v) is not Decimal:
            raise Misfit("not a number")
        if v and v.adjusted() >= p - s:
            raise Misfit(f"more than {p - s} digits before the point")
        scaled = v.scaleb(s, _EXACT)
        if scaled != scaled.to_integral_value(context=_EXACT):
            raise Misfit(f"more than {s} digits after the point")
        return Decimal(int(scaled)).scaleb(-s, _EXACT)

    return decimal


def _text(v: Any) -> str:
    """STRING: text as it is, any other value as its JSON text, every digit kept."""
    return v if type(v) is str else _json(v)


def _json(v: Any) -> str:
    if type(v) is dict:
        return "{" + ",".join(f"{orjson.dumps(k).decode()}:{_json(x)}" for k, x in v.items()) + "}"
    if type(v) is list:
        return "[" + ",".join(_json(x) for x in v) + "]"
    if type(v) is float:
        raise _Inexact
    if type(v) in (int, Decimal):
        return str(v)
    return orjson.dumps(v).decode()


def _boolean(v: Any) -> Any:
    if type(v) is not bool:
        raise Misfit("not true or false")
    return v


def _binary(v: Any) -> Any:
    if type(v) is not str:
        raise Misfit("not base64 text")
    try:
        return base64.b64decode(v, validate=True)
    except binascii.Error:
        raise Misfit("not base64 text") from None


def _date(v: Any) -> Any:
    t = iso_time(v) if type(v) is str and len(v) == 10 else None
    if t is None:
        raise Misfit("not an ISO date")
    return t.date()


def _time(v: Any) -> dt.datetime:
    t = iso_time(v) if type(v) is str else None
    if t is None:
        raise Misfit("not an ISO timestamp")
    return t


def _timestamp(v: Any) -> Any:
    t = _time(v)  # one without an offset: UTC, as Weir's capture writes timestamp columns
    if t.tzinfo is None:
        return t.replace(tzinfo=dt.UTC)
    try:  # Spark's timestamps are years 1 to 9999 in UTC
        return t.astimezone(dt.UTC)
    except OverflowError:
        raise Misfit("beyond the range of a timestamp") from None


def _timestamp_ntz(v: Any) -> Any:
    t = _time(v)  # one with an offset: its time in UTC
    return t if t.tzinfo is None else t.astimezone(dt.UTC).replace(tzinfo=None)


def _interval(v: Any) -> dt.timedelta:
    """An ISO 8601 duration (``P1DT2H3M4.5S``, each part signed as Postgres writes it) as a
    day-time interval: one with years or months has no fixed length and does not fit."""
    m = _DURATION.fullmatch(v) if type(v) is str and len(v) > 1 else None
    if m is None:
        raise Misfit("not an ISO 8601 interval")
    years, months, days, hours, minutes, seconds = m.groups()
    if int(years or 0) or int(months or 0):
        raise Misfit("an interval of years or months (write INTERVAL as STRING to keep them)")
    us = Decimal(seconds or 0).scaleb(6) + 60_000_000 * (60 * int(hours or 0) + int(minutes or 0))
    us += 86_400_000_000 * int(days or 0)
    if abs(us) >= 2**63:  # Spark's intervals are 64-bit microseconds (~106,751,991 days)
        raise Misfit("beyond the range of an interval")
    return dt.timedelta(microseconds=int(us))


_SCALARS: dict[type, Callable[[Any], Any]] = {
    BooleanType: _boolean, ByteType: _whole(8), ShortType: _whole(16),
    IntegerType: _whole(32), LongType: _whole(64), FloatType: _float, DoubleType: _double,
    StringType: _text, BinaryType: _binary, DateType: _date, TimestampType: _timestamp,
    TimestampNTZType: _timestamp_ntz, DecimalType: _decimal, DayTimeIntervalType: _interval,
}  # fmt: skip


def converter(t: DataType) -> Callable[[Any], Any]:
    """A function of a JSON value (not None) to what Arrow takes for ``t``; raises Misfit."""
    if isinstance(t, DecimalType):
        return _decimal(t)
    if isinstance(t, ArrayType):
        element = _nullable(converter(t.elementType))

        def array(v: Any) -> Any:
            if type(v) is not list:
                raise Misfit("not an array")
            return [element(x) for x in v]

        return array
    if isinstance(t, StructType):
        fields = [(f.name, _nullable(converter(f.dataType))) for f in t.fields]

        def struct(v: Any) -> Any:
            if type(v) is not dict:
                raise Misfit("not an object")
            return {name: conv(v.get(name)) for name, conv in fields}

        return struct
    if isinstance(t, MapType):
        value = _nullable(converter(t.valueType))

        def mapping(v: Any) -> Any:
            if type(v) is not dict:
                raise Misfit("not an object")
            return [(k, value(x)) for k, x in v.items()]

        return mapping
    return _SCALARS[type(t)]


def _nullable(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else conv(v)


# -- a page's columns ---------------------------------------------------------------------------

# Types whose values go to Arrow as orjson reads them, when all are of these Python types.
_AS_IS: dict[type, set[type]] = {
    ByteType: {int}, ShortType: {int}, IntegerType: {int}, LongType: {int},
    DoubleType: {int, float}, StringType: {str}, BooleanType: {bool},
}  # fmt: skip
_NONE = type(None)


class Columns:
    """Converts pages of records into the typed columns (built in the read task)."""

    def __init__(self, typed: StructType, permissive: bool, source: str) -> None:
        self.fields = typed.fields
        self.arrow = to_arrow_schema(typed, timezone="UTC")
        self.convs = [converter(f.dataType) for f in typed.fields]
        self.permissive, self.source = permissive, source

    def arrays(self, page: list[tuple[Any, ...]]) -> list[pa.Array]:
        """The typed columns of a page's rows (the reader's tuples: record text at 7)."""
        records = [None if r[7] is None else orjson.loads(r[7]) for r in page]
        records = [r if type(r) is dict else None for r in records]
        out = []
        for i, (f, conv) in enumerate(zip(self.fields, self.convs, strict=True)):
            name, kind = f.name, self.arrow.field(i).type
            values = [None if r is None else r.get(name) for r in records]
            plain = _AS_IS.get(type(f.dataType))
            if plain is not None and {type(v) for v in values} <= plain | {_NONE}:
                try:
                    out.append(pa.array(values, kind))
                    continue
                except (pa.ArrowInvalid, OverflowError):  # beyond the type's range: say where
                    pass
            out.append(pa.array([None if v is None else self._one(conv, v, page[n], name, f)
                                 for n, v in enumerate(values)], kind))  # fmt: skip
        return out

    def _one(self, conv: Callable[[Any], Any], v: Any, row: tuple[Any, ...], name: str,
             f: Any) -> Any:  # fmt: skip
        try:
            try:
                return conv(v)
            except _Inexact:
                v = json.loads(row[7], parse_float=Decimal)[name]
                return conv(v)
        except (Misfit, InvalidOperation, ValueError, OverflowError) as e:
            if self.permissive:
                return None
            raise SourceError(
                f"source {self.source}: seq {row[5]} ({row[2]}, record {row[3]}): field {name} "
                f"is a JSON {json_type(v)} that does not fit "
                f"{f.dataType.simpleString().upper()} ({e.args[0] if e.args else e}); option "
                "schemaMode permissive makes such values null"
            ) from None
