"""The names a store takes in what every session of its database shares: advisory locks,
NOTIFY channels and application names. Each carries the store's schema, so that two stores in
one database (two ``store.schema``) never meet there, whatever their sources and connectors are
named. Imports nothing of the store: every store module, migrations too, can use it.
"""

from __future__ import annotations

import hashlib


def lock_key(schema: str, kind: str, name: str = "") -> str:
    """The key of one of the store's advisory locks (taken as ``hashtextextended(key, 0)``): a
    lock of ``kind`` on ``name``. The schema is quoted as an identifier, so that no two
    (schema, name) pairs make one key; ``name`` comes last, so that SQL can append it to
    ``lock_key(schema, kind)`` (core/store/functions.py)."""
    quoted = '"' + schema.replace('"', '""') + '"'
    return f"weir:{kind}:{quoted}:{name}"


def tag(schema: str) -> str:
    """The schema as a name of fixed length (its MD5 in hex), for the names Postgres bounds to
    63 bytes."""
    return hashlib.md5(schema.encode(), usedforsecurity=False).hexdigest()


def channel(schema: str) -> str:
    """The NOTIFY channel on which the store's writers announce their commits to its readers."""
    return "weir_stream_" + tag(schema)


def lease_application(schema: str, group: str) -> str:
    """The start of the application name of the store's lease connections of ``group``: what
    finds an instance's peers in ``pg_stat_activity`` (core/store/leases.py)."""
    return f"weir-leases:{group}.{tag(schema)[:6]}:"
