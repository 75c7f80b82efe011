"""Identifiers users and subscribers see: sync ids, collection ids, record ids, subject tokens.

docs/configuration.md “Source database”; docs/design.md “Subjects and record ids” (contract). One
place for each rule: the capture path, HTTP ingest, the Spark seed job and the connectors all call
these.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-:")
_ESCAPES = [chr(b) if b in _SAFE else f"%{b:02X}" for b in range(256)]


def sync_id_for(name: str) -> uuid.UUID:
    """The sync id of a source that was given no ``id:`` in YAML."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "weir:source:" + name)


def encode_token(value: str) -> str:
    """One subject token: keeps ``A-Z a-z 0-9 _ - :``, every other UTF-8 byte becomes ``%XX``.

    The result never holds ``.``, ``*``, ``>`` or white space; an empty value is ``%EMPTY``.
    """
    if not value:
        return "%EMPTY"
    if value.isascii() and value.replace("_", "a").replace("-", "a").replace(":", "a").isalnum():
        return value  # the common case (integers, uuids, slugs): nothing to escape
    return escaped(value)


def escaped(text: str) -> str:
    """Text as tokens write it, byte by byte (a piece of one: no ``%EMPTY``)."""
    return "".join([_ESCAPES[b] for b in text.encode()])


NULL_TOKEN = "%NULL"  # a NULL key value: never the same as any text (whose % is encoded)


def key_token(value: Any) -> str:
    """One key column value as a token (booleans as Postgres prints them, json as its text)."""
    if value is None:
        return NULL_TOKEN
    if value is True:
        return "t"
    if value is False:
        return "f"
    if isinstance(value, bytes):  # json/jsonb text (core.envelope.RawJson)
        return encode_token(value.decode())
    return encode_token(str(value))


def record_id_of(key_values: Sequence[Any]) -> str:
    """The record id from the key column values, already in subject-token form.

    One key column: its encoded text (``42``, ``0b6c…``; NULL is ``%NULL``). Several: the
    encoded values joined with ``,``. Subjects use it as their record token, hashed when long
    (core/envelope.py); ``metadata.record_id`` always holds it whole.
    """
    if len(key_values) == 1:  # the common case, without a list to join (~0.15 us a row)
        value = key_values[0]
        if type(value) is int:  # digits and "-": nothing to escape (~0.3 us a row)
            return str(value)
        return key_token(value)
    return ",".join([key_token(v) for v in key_values])


def collection_id_of(schema: str, table: str) -> str:
    """``public.users`` -> ``public:users``. A ``:`` or ``%`` in the schema's name is written
    ``%3A`` or ``%25``, so that ``"a:b".c`` and ``a."b:c"`` are two collections."""
    if ":" in schema or "%" in schema:
        schema = schema.replace("%", "%25").replace(":", "%3A")
    return f"{schema}:{table}"


def schema_table_of(collection_id: str) -> tuple[str, str]:
    """The (schema, table) of a Postgres collection id: ``collection_id_of`` undone."""
    schema, _, table = collection_id.partition(":")
    if "%" in schema:
        schema = schema.replace("%3A", ":").replace("%25", "%")
    return schema, table


def lsn_to_str(lsn: int) -> str:
    """``0/16B3748`` form, as Postgres prints LSNs."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def str_to_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)
