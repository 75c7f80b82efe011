"""Connectors made over the management API (docs/operations.md “Management API and CLI”), kept in
the store's ``api_connectors`` table as the JSON of their config: ``weir run`` runs them
beside the file's (core/config/model.py ``WeirConfig.with_stored``) and picks changes up at
its lease polls, through the table's version (core/store/leases.py reads it with the heartbeat).
Each making of a connector has an id of its own, which a change keeps: one deleted and made again
under its name is another connector, and the old one's sessions, which carry its id, can neither
move nor make its cursors (core/store/cursors.py).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from core.config.model import WeirConfig
from core.redact import remember_config, said
from core.store import AConn, Store
from core.store.cursors import fence_key

# What changes when a connector is made, changed or deleted.
VERSION = "SELECT count(*)::text || '/' || coalesce(max(changed_at)::text, '') FROM {}"


DELETE_WAIT = 30.0  # seconds a delete waits for the connector's sessions to end (drains)

# Each connector's id (its making), config, the heads of its sources when it was made, and those
# of the sources changes added, at the change (by sync id: [events seq, records seq]).
Heads = dict[str, list[int]] | None
Stored = list[tuple[int, dict[str, Any], Heads, Heads]]


class StillSending(Exception):
    """A deleted connector's session did not end within ``DELETE_WAIT``."""


LOAD = "SELECT id, config, heads, added FROM {} ORDER BY name"


def _load(store: Store) -> Stored:
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(sql.SQL(LOAD).format(store.table("api_connectors"))
                                       ).fetchall()  # fmt: skip
    return [(int(i), dict(c), h, a) for i, c, h, a in rows]


def with_api_connectors(cfg: WeirConfig, store: Store) -> WeirConfig:
    """``cfg`` with the connectors made over the API after the file's (the commands' view),
    their secrets hidden and their names known as the file's are (core/redact.py)."""
    merged = cfg.with_stored(_load(store))
    remember_config(merged)
    return merged


def clashes(cfg: WeirConfig, store: Store) -> list[str]:
    """Connectors the file declares that were made over the API too: the store's cursors and
    marks of that name are the API-made one's, which ``weir run`` refuses to mix up."""
    declared = {c.name for c in cfg.connectors}
    return sorted(str(c.get("name")) for _, c, _, _ in _load(store) if c.get("name") in declared)


async def aload(store: Store, conn: AConn) -> Stored:
    q = sql.SQL(LOAD).format(store.table("api_connectors"))
    return [(int(i), dict(c), h, a) for i, c, h, a in await (await conn.execute(q)).fetchall()]


async def raw(store: Store, conn: AConn, name: str) -> dict[str, Any] | None:
    """An API-made connector's config as it was sent (its secrets in it), or None."""
    q = sql.SQL("SELECT config FROM {} WHERE name = %s").format(store.table("api_connectors"))
    row = await (await conn.execute(q, (name,))).fetchone()
    return dict(row[0]) if row else None


async def put(store: Store, conn: AConn, name: str, config: str, new: bool,
              added: list[str] | None = None) -> bool:  # fmt: skip
    """Store a connector's config: a ``new`` one (False when the name is taken), a connector
    of its own (a new id) that starts afresh, or over the one of that name, which keeps its
    id and so its cursors (False when there is none); the change notes the heads of the
    sources it ``added`` (their names), where the connector starts reading them."""
    t = store.table("api_connectors")
    async with conn.transaction():
        if not new:
            q = sql.SQL(
                "UPDATE {} SET config = %s, changed_at = now(), added = coalesce(added, '{{}}')"
                " || coalesce((SELECT jsonb_object_agg(sync_id::text, jsonb_build_array("
                "events_seq, records_seq)) FROM {} WHERE name = ANY(%s)), '{{}}') WHERE name = %s"
            ).format(t, store.table("sources"))
            return int((await conn.execute(q, (config, added or [], name))).rowcount) == 1
        q = sql.SQL(
            "INSERT INTO {} (name, config, heads) SELECT %s, %s, (SELECT jsonb_object_agg("
            "sync_id::text, jsonb_build_array(events_seq, records_seq)) FROM {})"
            " ON CONFLICT (name) DO NOTHING"
        ).format(t, store.table("sources"))
        if int((await conn.execute(q, (name, config))).rowcount) != 1:
            return False
        await _clear(store, conn, name)  # what a session that outlived a delete left
    return True


async def delete(store: Store, conn: AConn, name: str) -> bool:
    """Delete a connector; False when there was none. Its config and cursors go in one
    transaction: its sessions, on every instance, stop at their next cursor save (a tenth of
    a second under load) or lease poll (a second), and none starts again, since the connector
    they run (its id) is gone (core/store/cursors.py). Then it waits until each session that
    held one of its cursors has ended (its fence is free), so that nothing more reaches the
    destination once this returns, and clears its failed list and pause (and what a session
    failed meanwhile). StillSending when one did not end within ``DELETE_WAIT``."""
    async with conn.transaction():
        q = sql.SQL("DELETE FROM {} WHERE name = %s").format(store.table("api_connectors"))
        if (await conn.execute(q, (name,))).rowcount != 1:
            return False
        held = await _clear(store, conn, name)
    deadline = time.monotonic() + DELETE_WAIT
    for key, sync_id in held:
        try:
            async with conn.transaction():
                left = max(1, int((deadline - time.monotonic()) * 1000))
                await conn.execute("SELECT set_config('lock_timeout', %s, true)", (str(left),))
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                                   (fence_key(store, key, sync_id),))  # fmt: skip
        except psycopg.errors.LockNotAvailable:
            raise StillSending(
                said(
                    "connector %s is deleted, but its session of %s on source %s did "
                    "not end within %ss: stop the instance that runs it (weir status "
                    "names it), whose batches out may still reach the destination",
                    name,
                    key,
                    sync_id,
                    format(DELETE_WAIT, ".0f"),
                )
            ) from None
    await _clear(store, conn, name)
    return True


async def _clear(store: Store, conn: AConn, name: str) -> list[tuple[str, str]]:
    """Delete what is kept under a connector's name: its cursors (their keys and sources are
    returned), failed list and pause."""
    t = store.table
    cur = await conn.execute(
        sql.SQL("DELETE FROM {} WHERE connector = %s OR connector LIKE %s"
                " RETURNING connector, sync_id::text").format(t("cursors")),
        (name, name.replace("_", r"\_") + "#%"),
    )  # fmt: skip
    held = [(str(k), str(s)) for k, s in await cur.fetchall()]
    for table, column in (("failed_messages", "connector"), ("connector_controls", "name")):
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE {} = %s").format(t(table), sql.Identifier(column)),
            (name,),
        )
    return held
