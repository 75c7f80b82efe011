"""Identifiers users and subscribers see: sync ids, collection ids, record ids, subject tokens.

DESIGN.md sections 3 and 5 (contract). One place for each rule: the capture path, HTTP ingest,
the Spark seed job and the connectors all call these.
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
    return "".join([_ESCAPES[b] for b in value.encode()])


def key_text(value: Any) -> str:
    """How one key column value reads in a record id (booleans as Postgres prints them)."""
    if value is True:
        return "t"
    if value is False:
        return "f"
    return str(value)


def record_id_of(key_values: Sequence[Any]) -> str:
    """The record id from the key column values, already in subject-token form.

    One key column: its encoded text (``42``, ``0b6c…``). Several: the encoded values joined
    with ``,``. Because the record id is the token, ``metadata.record_id`` and the subject's
    record token are always the same string.
    """
    if len(key_values) == 1:  # the common case, without a list to join (~0.15 us a row)
        value = key_values[0]
        if type(value) is int:  # digits and "-": nothing to escape (~0.3 us a row)
            return str(value)
        return encode_token(key_text(value))
    return ",".join([encode_token(key_text(v)) for v in key_values])


def collection_id_of(schema: str, table: str) -> str:
    """``public.users`` -> ``public:users``."""
    return f"{schema}:{table}"
