"""Connectors made over the management API (README “Operations”), kept in the store's
``api_connectors`` table as the JSON of their config: ``weir run`` runs them beside the file's
(core/config/model.py ``WeirConfig.with_stored``) and picks changes up at its lease polls,
through the table's version (core/store/leases.py reads it with the heartbeat).
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from core.config.model import WeirConfig
from core.store import AConn, Store

# What changes when a connector is made, changed or deleted.
VERSION = "SELECT count(*)::text || '/' || coalesce(max(changed_at)::text, '') FROM {}"


def _load(store: Store) -> list[dict[str, Any]]:
    q = sql.SQL("SELECT config FROM {} ORDER BY name").format(store.table("api_connectors"))
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(q).fetchall()
    return [dict(r[0]) for r in rows]


def with_api_connectors(cfg: WeirConfig, store: Store) -> WeirConfig:
    """``cfg`` with the connectors made over the API after the file's (the commands' view)."""
    return cfg.with_stored(_load(store))


def clashes(cfg: WeirConfig, store: Store) -> list[str]:
    """Connectors the file declares that were made over the API too: the store's cursors and
    marks of that name are the API-made one's, which ``weir run`` refuses to mix up."""
    declared = {c.name for c in cfg.connectors}
    return sorted(str(c.get("name")) for c in _load(store) if c.get("name") in declared)


async def aload(store: Store, conn: AConn) -> list[dict[str, Any]]:
    q = sql.SQL("SELECT config FROM {} ORDER BY name").format(store.table("api_connectors"))
    return [dict(r[0]) for r in await (await conn.execute(q)).fetchall()]


async def raw(store: Store, conn: AConn, name: str) -> dict[str, Any] | None:
    """An API-made connector's config as it was sent (its secrets in it), or None."""
    q = sql.SQL("SELECT config FROM {} WHERE name = %s").format(store.table("api_connectors"))
    row = await (await conn.execute(q, (name,))).fetchone()
    return dict(row[0]) if row else None


async def put(store: Store, conn: AConn, name: str, config: str, new: bool) -> bool:
    """Store a connector's config: a ``new`` one (False when the name is taken), which starts
    afresh (what a deleted one of that name left is cleared), or over the one of that name
    (False when there is none)."""
    t = store.table("api_connectors")
    async with conn.transaction():
        if not new:
            q = sql.SQL("UPDATE {} SET config = %s, changed_at = now() WHERE name = %s").format(t)
            return int((await conn.execute(q, (config, name))).rowcount) == 1
        q = sql.SQL(
            "INSERT INTO {} (name, config) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
        ).format(t)
        if int((await conn.execute(q, (name, config))).rowcount) != 1:
            return False
        await _clear(store, conn, name)
    return True


async def delete(store: Store, conn: AConn, name: str) -> bool:
    """Delete a connector with its cursors (every shard's), failed list and pause, in one
    transaction; False when there was none. Its sessions stop at their next lease poll (a
    cursor one of them saves meanwhile is cleared when a connector of that name is made)."""
    async with conn.transaction():
        q = sql.SQL("DELETE FROM {} WHERE name = %s").format(store.table("api_connectors"))
        if (await conn.execute(q, (name,))).rowcount != 1:
            return False
        await _clear(store, conn, name)
    return True


async def _clear(store: Store, conn: AConn, name: str) -> None:
    t = store.table
    await conn.execute(
        sql.SQL("DELETE FROM {} WHERE connector = %s OR connector LIKE %s").format(t("cursors")),
        (name, name.replace("_", r"\_") + "#%"),
    )
    for table, column in (("failed_messages", "connector"), ("connector_controls", "name")):
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE {} = %s").format(t(table), sql.Identifier(column)),
            (name,),
        )
