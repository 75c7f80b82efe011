"""How a source database's text becomes Python text (docs/design.md “Values”, text): the one place.

The rule: **text is what a UTF-8 client reads from the table**, whatever the database's encoding:
the server's own conversion to UTF-8 (``pg_conversion``'s default), not a Python codec, which
differs from it (Python's ``euc_jp`` has no ``①``, its ``euc_jis_2004`` reads 0xA1BD as U+2015
where Postgres reads U+2014, ``euc_kr`` lacks 0xA2E8, ``EUC_TW`` has none; the single-byte
ones agree with Postgres 16). Text no UTF-8 client can read (a ``SQL_ASCII`` database's bytes
that are not UTF-8; a character the database holds and Postgres has no UTF-8 for, such as
WIN1252's 0x81 or EUC_JP's 0xA9A1) arrives as its bytes, the whole value, one Latin-1
character a byte (``value.encode("latin-1")`` gives them back). ``MULE_INTERNAL`` has no
conversion to UTF-8: no UTF-8 client can connect to such a database, and Weir refuses it
(:func:`connect`).

How each reader gets there:

- Capture: the replication connection runs with ``client_encoding=SQL_ASCII``
  (:data:`REPLICATION_CLIENT_ENCODING`), so pgoutput sends values and names as the database
  holds them (``pq_sendcountedtext`` and ``pq_sendstring`` convert nothing). Converting there
  would let one unconvertible character end the stream, at every restart. :class:`SourceText`
  reads them.
- Backfill and seed: ``COPY ... TO STDOUT (ENCODING server_encoding)`` (:func:`copy_options`)
  hands the rows over likewise, to the same :class:`SourceText` (the JDBC path selects
  ``convert_to(col::text, server_encoding)``, the same bytes).
- Catalog reads (names of schemas, tables, columns, types): ordinary connections with
  ``client_encoding=UTF8`` (:func:`connect`): the server converts, as for any UTF-8 client.

:class:`SourceText` splits a value into the database's characters (by the encoding's byte
rules, ``pg_encoding_mblen``) and asks the server, once per character and process, what UTF-8 it
converts each to (``convert(bytes, encoding, 'UTF8')``), so it is the server's conversion
character for character. ASCII is the same in every server encoding and is never asked.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg

from core.redact import said
from core.sources.pg.errors import SourceSetupError

# The client encoding of the replication connection: the server converts nothing for it.
REPLICATION_CLIENT_ENCODING = "SQL_ASCII"
# The client encoding of every other connection to a source database.
CLIENT_ENCODING = "UTF8"

# Server encodings whose characters are not one byte each: a pattern of one character (not
# ASCII) over the value's bytes read as Latin-1, after pg_encoding_mblen (src/common/wchar.c).
# A lone byte at the end (never sent by a server that verified its text) is a character of
# its own, which the server then converts to nothing.
_EUC = "\x8e[\x80-\xff]|\x8f[\x80-\xff]{2}|[\x80-\xff]{2}|[\x80-\xff]"  # pg_euc_mblen
_MULTIBYTE = {
    "EUC_JP": _EUC,
    "EUC_JIS_2004": _EUC,
    "EUC_KR": _EUC,
    "EUC_CN": "[\x80-\xff]{2}|[\x80-\xff]",  # pg_euccn_mblen
    "EUC_TW": "\x8e[\x80-\xff]{3}|\x8f[\x80-\xff]{2}|[\x80-\xff]{2}|[\x80-\xff]",  # pg_euctw_mblen
}

_ASCII = bytes(range(0x80))


class _Chars:
    """What the server converts each character (not ASCII) of one encoding to: ``known``, None
    where it converts it to nothing; for single-byte encodings also as ``charmap``, a decoding
    table of ``codecs.charmap_decode`` (U+FFFE: not known, or nothing). One per (encoding,
    server version), shared by every source of the process: a character is asked once."""

    __slots__ = ("charmap", "known")

    def __init__(self) -> None:
        self.known: dict[str, str | None] = {}
        self.charmap = "".join(map(chr, range(0x80))) + "\ufffe" * 0x80

    def add(self, chars: list[str], utf8: list[str | None]) -> None:
        with _LEARNING:
            table = list(self.charmap)
            for c, u in zip(chars, utf8, strict=True):
                self.known[c] = u
                if u is not None and len(c) == 1 and len(u) == 1:
                    table[ord(c)] = u
            self.charmap = "".join(table)


_KNOWN: dict[tuple[str, int], _Chars] = {}
_LEARNING = threading.Lock()

Learn = Callable[[str, list[bytes]], list[str | None]]


class UnreadableDatabase(SourceSetupError):
    """A source database no UTF-8 client can read (``MULE_INTERNAL``)."""


class SourceText:
    """Reads the text of one database, as bytes in its encoding, as a UTF-8 client reads it.

    ``learn`` asks the server what it converts characters to (:func:`learner`); it is set
    where a connection is at hand (the capture's catalog connection, a backfill's) and is not
    pickled: a Spark task sets its own (:func:`learning`). A value of characters this process
    has met before needs no server.
    """

    __slots__ = ("_chars", "_split", "converts", "encoding", "learn", "version")

    def __init__(self, encoding: str = "UTF8", version: int = 0, learn: Learn | None = None):
        self.encoding = encoding.upper()
        self.version = version
        self.learn = learn
        # Whether the server converts this database's text for a UTF-8 client (not UTF-8
        # itself, nor SQL_ASCII's bytes).
        self.converts = self.encoding not in ("UTF8", "SQL_ASCII")
        pattern = _MULTIBYTE.get(self.encoding)  # none: one byte a character
        self._split = re.compile(f"({pattern})").split if pattern else None
        self._chars = _KNOWN.setdefault((self.encoding, version), _Chars())

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceText, (self.encoding, self.version))

    def __repr__(self) -> str:
        return f"SourceText({self.encoding!r})"

    def __call__(self, b: bytes) -> str:
        read = self.read(b)
        return b.decode("latin-1") if read is None else read

    def read(self, b: bytes) -> str | None:
        """The text as a UTF-8 client reads it; None when none can."""
        if not self.converts:  # UTF-8 (always valid), or SQL_ASCII's bytes
            try:
                return b.decode()
            except UnicodeDecodeError:
                return None
        s = b.decode("latin-1")  # one character a byte: the alphabet of the split
        if b.isascii():
            return s
        chars = self._chars
        split = self._split
        if split is None:  # one byte a character: a decoding table, once each is known
            try:
                return codecs.charmap_decode(b, "strict", chars.charmap)[0]
            except UnicodeDecodeError:
                high = set(b.translate(None, _ASCII).decode("latin-1"))
                self._learn(high - chars.known.keys())
            try:
                return codecs.charmap_decode(b, "strict", chars.charmap)[0]
            except UnicodeDecodeError:  # a character no UTF-8 client can read, or one
                pass  # the server converts to more than one character: the long way
            if any(chars.known[c] is None for c in high):
                return None
            return "".join(chars.known.get(c) or c for c in s)
        parts = split(s)  # text between characters, a character, text between, ...
        known = chars.known
        try:
            out = [known[c] for c in parts[1::2]]
        except KeyError:
            self._learn({c for c in parts[1::2] if c not in known})
            out = [known[c] for c in parts[1::2]]
        if None in out:
            return None  # a character no UTF-8 client can read
        parts[1::2] = out
        return "".join(parts)

    def _learn(self, chars: set[str]) -> None:
        if not chars:
            return
        if self.learn is None:
            raise RuntimeError(
                said(
                    "text of a %s database read with no connection to learn its "
                    "characters from (core/sources/pg/encoding.py)",
                    self.encoding,
                )
            )
        ordered = sorted(chars)
        self._chars.add(ordered, self.learn(self.encoding, [c.encode("latin-1") for c in ordered]))


# A character with no UTF-8 (22P05), or bytes that are no character of the encoding (22021).
_NO_UTF8 = (psycopg.errors.UntranslatableCharacter, psycopg.errors.CharacterNotInRepertoire)
UTF8_TEXT = SourceText()  # a UTF-8 database's

_CONVERT = (
    "SELECT convert(c, %s, 'UTF8') FROM unnest(%s::bytea[]) WITH ORDINALITY AS u(c, n) ORDER BY n"
)


def learner(conn: psycopg.Connection[Any]) -> Learn:
    """Asks ``conn``'s server what it converts characters of ``encoding`` to: all in one
    statement, or (one of them has no UTF-8) one at a time, None for those. ``conn`` is in
    autocommit and not in a COPY when it is asked."""

    def learn(encoding: str, chars: list[bytes]) -> list[str | None]:
        try:
            rows = conn.execute(_CONVERT, (encoding, chars)).fetchall()
            return [bytes(r[0]).decode() for r in rows]
        except _NO_UTF8:
            pass
        out: list[str | None] = []
        for c in chars:
            try:
                row = conn.execute("SELECT convert(%s, %s, 'UTF8')", (c, encoding)).fetchone()
                out.append(bytes(row[0]).decode() if row else None)
            except _NO_UTF8:
                out.append(None)
        return out

    return learn


def source_text(conn: psycopg.Connection[Any]) -> SourceText:
    """The reader of text of ``conn``'s database, learning from ``conn``."""
    row = conn.execute("SHOW server_encoding").fetchone()
    return SourceText(str(row[0]) if row else "UTF8", conn.info.server_version, learner(conn))


@contextlib.contextmanager
def learning(texts: Iterable[SourceText], connect: Callable[[], Any]) -> Iterator[None]:
    """While a connection streams a COPY, ``texts`` learn through another, made by
    ``connect`` on the first character they do not know and closed at the end."""
    conn: Any = None

    def learn(encoding: str, chars: list[bytes]) -> list[str | None]:
        nonlocal conn
        if conn is None:
            conn = connect()
        return learner(conn)(encoding, chars)

    texts = [t for t in texts if t.converts]
    for t in texts:
        t.learn = learn
    try:
        yield
    finally:
        for t in texts:
            t.learn = None
        if conn is not None:
            conn.close()


def unreadable_name(source: str, e: Exception) -> str:
    """What to say when a catalog read met a name no UTF-8 client can read."""
    return (
        f"source {source!r}: {str(e).strip().splitlines()[0]}: a schema, table or column of "
        "the database has a name with a character its encoding has and Postgres converts to "
        "no UTF-8; Weir reads names as a UTF-8 client does (docs/design.md “Values”): rename it"
    )


def copy_options(text: SourceText) -> str:
    """The options of a ``COPY ... TO STDOUT`` whose rows ``text`` reads: unconverted (for a
    SQL_ASCII database too: to UTF-8, COPY would refuse the bytes that are not UTF-8)."""
    return "" if text.encoding == "UTF8" else f" (ENCODING '{text.encoding}')"


def connect(url: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """An ordinary connection to a source database, in UTF-8 whatever its encoding (psycopg
    would read a SQL_ASCII database's text as bytes); a ``MULE_INTERNAL`` one is refused
    saying why."""
    try:
        return psycopg.connect(url, client_encoding=CLIENT_ENCODING, **kwargs)
    except psycopg.OperationalError as e:
        if "between UTF8 and MULE_INTERNAL is not supported" not in str(e):
            raise
        raise UnreadableDatabase(
            "the source database's encoding is MULE_INTERNAL, which Postgres converts to no "
            "UTF-8: no UTF-8 client, Weir included, can read it (docs/design.md “Values”); "
            "use a database in another encoding"
        ) from None
