"""Reading rows as ``COPY ... TO STDOUT`` streams them (text format): its lines, taken from
libpq directly, and their columns' text with COPY's escapes undone (None for NULL). The reads
of source tables use it: backfills' pages (core/sources/backfill.py) and the seed job's key
ranges (core/sources/pg/snapshot.py ``read_records``).
"""

from __future__ import annotations

import re
import select
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import pq, sql

_ESCAPED = re.compile(rb"\\(.)")
_ESCAPES = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _unescape(m: re.Match[bytes]) -> bytes:
    c = m.group(1)
    return _ESCAPES.get(c, c)


def unescape(text: bytes) -> bytes:
    """A column's text as COPY escaped it, unescaped."""
    return _ESCAPED.sub(_unescape, text)


def split_copy_line(line: bytes) -> list[bytes | None]:
    """One line of ``COPY ... TO STDOUT`` (text format) to its columns' text, None for NULL."""
    fields: list[bytes | None] = list(line[:-1].split(b"\t"))
    if b"\\" in line:
        for i, f in enumerate(fields):
            if f is not None and b"\\" in f:
                fields[i] = None if f == b"\\N" else unescape(f)
    return fields


def copy_rows(
    conn: psycopg.Connection[Any], query: sql.Composed, options: str = ""
) -> Iterator[list[bytes | None]]:
    """The rows of ``query`` as its columns' text, streamed by COPY (with ``options``:
    ``TablePlan.copy_options``)."""
    return map(split_copy_line, copy_lines(conn, query, options))


def copy_lines(
    conn: psycopg.Connection[Any], query: sql.Composed, options: str = ""
) -> Iterator[bytes]:
    """The rows of ``query`` as lines of ``COPY ... TO STDOUT`` (text format), streamed.

    Rows that libpq already holds are taken from it directly (``pgconn.get_copy_data``):
    psycopg's ``Copy.read`` costs ~1 us more a row, about what a seed's task spends a row.
    psycopg waits for the socket when libpq holds none.
    """
    copy_sql = sql.SQL("COPY ({}) TO STDOUT" + options).format(query)
    with conn.cursor() as cur, cur.copy(copy_sql) as copy:
        pgconn = conn.pgconn
        while True:
            n, view = pgconn.get_copy_data(1)
            if n > 0:
                data = bytes(view)
            elif n == 0:  # none held: psycopg waits for one, or for the end and its result
                data = bytes(copy.read())
                if not data:
                    return
            else:  # the end, seen here: take the COPY's result as psycopg would
                _end_copy_out(pgconn, conn.info.encoding)
                return
            yield data


def _end_copy_out(pgconn: pq.abc.PGconn, encoding: str) -> None:
    """Take the results of a COPY TO whose end libpq has seen, waiting in ``select``, and
    raise the server's error if it sent one."""
    error = None
    while True:
        while pgconn.is_busy():
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        if result.status != pq.ExecStatus.COMMAND_OK:
            error = error or psycopg.errors.error_from_result(result, encoding)
    if error:
        raise error
