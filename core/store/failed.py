"""The failed lists: messages a connector gave up on after its retry policy, or an HTTP pull
consumer's after ``max_deliver`` deliveries, each with why (table ``failed_messages``, keyed
by connector name; a consumer's by :func:`core.store.consumers.consumer_key`).
"""

from __future__ import annotations

from typing import Any

import orjson
from psycopg import sql

from core.envelope import Message
from core.store import AConn, Store

# A message that fails again (a connector replaying it, two sweeps racing) keeps one entry,
# with the latest attempts and error.
_PUT = (
    "INSERT INTO {} (connector, sync_id, stream, seq, group_key, idempotency_key, attempts,"
    " error, payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (connector, sync_id, seq) DO UPDATE SET attempts = excluded.attempts,"
    " error = excluded.error, failed_at = now()"
)
_READ = (
    "SELECT seq, idempotency_key, attempts, error, payload, failed_at FROM {}"
    " WHERE connector = %s ORDER BY failed_at, seq LIMIT %s"
)


async def put(
    store: Store,
    conn: AConn,
    connector: str,
    stream: str,
    failed: list[tuple[Message, int, str]],
) -> None:
    """Put messages, each with its attempts and error, on ``connector``'s failed list; called
    when a message is given up on, in the caller's transaction."""
    q = sql.SQL(_PUT).format(store.table("failed_messages"))
    async with conn.cursor() as cur:
        await cur.executemany(
            q,
            [(connector, m.sync_id, stream, m.seq, m.group, m.key, attempts, error,
              m.payload.decode()) for m, attempts, error in failed],
        )  # fmt: skip


async def read(store: Store, conn: AConn, connector: str, limit: int) -> list[dict[str, Any]]:
    """The oldest ``limit`` entries of ``connector``'s failed list, as the API shows them."""
    q = sql.SQL(_READ).format(store.table("failed_messages"))
    cur = await conn.execute(q, (connector, limit))
    return [
        {"seq": r[0], "idempotency_key": r[1], "deliveries": r[2], "error": r[3],
         "message": orjson.loads(r[4]), "failed_at": r[5].isoformat()}
        for r in await cur.fetchall()
    ]  # fmt: skip
