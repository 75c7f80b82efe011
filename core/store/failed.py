"""The failed lists: messages a connector gave up on after its retry policy, or an HTTP pull
consumer's after ``max_deliver`` deliveries, each with why (table ``failed_messages``, keyed
by connector name; a consumer's by :func:`core.store.consumers.consumer_key`).
"""

from __future__ import annotations

from psycopg import sql

from core.envelope import Message
from core.redact import redact
from core.store import AConn, Store
from core.store.streams import present

# A message that fails again (a connector replaying it, two sweeps racing) keeps one entry,
# with the latest error; a retried one's attempts add up.
_PUT = (
    "INSERT INTO {} AS f (connector, sync_id, stream, seq, group_key, idempotency_key, attempts,"
    " error, payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (connector, sync_id, seq) DO UPDATE SET attempts = excluded.attempts"
    " + CASE WHEN f.retry_requested_at IS NULL THEN 0 ELSE f.attempts END,"
    " error = excluded.error, failed_at = now(), retry_requested_at = NULL"
)
# The entries of a connector's list (of one source) that an operator asked to retry, oldest
# first, each with whether it is still to be sent: a records-stream version is not once a
# newer one replaced it; an event always is (the entry holds its payload, which retention
# deleting the event's batch does not change).
_RETRIES = (
    "SELECT f.seq, f.group_key, f.idempotency_key, f.payload, {present}"
    " FROM {failed} f WHERE f.connector = %s AND f.sync_id = %s"
    " AND f.retry_requested_at IS NOT NULL ORDER BY f.seq LIMIT %s"
)


async def put(
    store: Store,
    conn: AConn,
    connector: str,
    stream: str,
    failed: list[tuple[Message, int, str]],
) -> None:
    """Put messages, each with its attempts and error, on ``connector``'s failed list; called
    when a message is given up on, in the caller's transaction. The error is redacted here,
    where every secret of the connector is known: the list is read by the API, the console
    and ``weir failed``, whichever process they run in."""
    q = sql.SQL(_PUT).format(store.table("failed_messages"))
    async with conn.cursor() as cur:
        await cur.executemany(
            q,
            [(connector, m.sync_id, stream, m.seq, m.group, m.key, attempts, redact(error),
              m.payload.decode()) for m, attempts, error in failed],
        )  # fmt: skip


async def retries(
    store: Store, conn: AConn, connector: str, stream: str, sync_id: str, limit: int
) -> list[tuple[int, str, str, bytes, bool]]:
    """Up to ``limit`` entries of ``connector``'s list from source ``sync_id`` that are to be
    sent again: (seq, group key, idempotency key, payload, still to be sent)."""
    current = present(store, stream, "f") if stream == "records" else sql.SQL("true")
    q = sql.SQL(_RETRIES).format(present=current, failed=store.table("failed_messages"))
    rows = await (await conn.execute(q, (connector, sync_id, limit))).fetchall()
    return [(int(r[0]), r[1], r[2], r[3].encode(), bool(r[4])) for r in rows]


async def resolve(store: Store, conn: AConn, connector: str, sync_id: str, seqs: list[int]) -> None:
    """Take entries off ``connector``'s list: sent again and taken by the broker, or replaced
    by a newer version of their record."""
    q = sql.SQL("DELETE FROM {} WHERE connector = %s AND sync_id = %s AND seq = ANY(%s)").format(
        store.table("failed_messages")
    )
    await conn.execute(q, (connector, sync_id, seqs))
