"""Where a start position begins in a source's stream: a connector's first cursor, a consumer's
and a Spark read's; and the warning when it begins in events retention deleted."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Protocol

from psycopg import sql

from core.config.connector import SeqStart, TimeStart
from core.redact import said
from core.store import AConn, Store
from core.store.batches import Entries
from core.store.cursors import NotNow

log = logging.getLogger("weir.engine")


class StreamReader(Protocol):
    """What of core/store/reader.py's ``StreamReader`` a start needs."""

    store: Store
    connector: str
    stream: str
    sync_id: str
    end: int | None

    @property
    def conn(self) -> AConn: ...

    async def head(self) -> int: ...


async def start_seq(reader: StreamReader, start: Any) -> int:
    """The last seq before where ``start`` begins. An events start time at or before the newest
    event retention deleted begins in those events: at the stream's first, as ``beginning``
    does (``tell_deleted`` says so, and a Spark read of them fails)."""
    if start == "beginning":
        return 0
    if start == "end":
        return reader.end if reader.end is not None else await reader.head()
    if isinstance(start, SeqStart):
        return start.seq - 1
    assert isinstance(start, TimeStart)
    at, sync_id, table = start.utc, reader.sync_id, reader.store.table
    if reader.stream == "records":
        q = sql.SQL("SELECT min(seq) FROM {} WHERE sync_id = %s AND updated_at >= %s")
        row = await (await reader.conn.execute(q.format(table("record_index")),
                                               (sync_id, at))).fetchone()  # fmt: skip
        if row is None or row[0] is None:
            return await _head_by(reader, at)
        return int(row[0]) - 1
    q = sql.SQL("SELECT events_pruned_to FROM {} WHERE sync_id = %s")
    row = await (await reader.conn.execute(q.format(table("sources")), (sync_id,))).fetchone()
    if row is not None and row[0] is not None and at <= row[0]:
        return 0
    q = sql.SQL("SELECT first_seq, data FROM {} WHERE sync_id = %s AND last_committed_at >= %s"
                " ORDER BY first_seq LIMIT 1")  # fmt: skip
    row = await (await reader.conn.execute(q.format(table("event_batches")),
                                           (sync_id, at))).fetchone()  # fmt: skip
    if row is None:
        return await _head_by(reader, at)
    when = at.timestamp()
    entries = Entries.decode(row[1])
    first = next((i for i, ts in enumerate(entries.ts) if epoch(ts) >= when), 0)
    return int(row[0]) + first - 1


class StartToCome(NotNow):
    """A start time still to come: nothing can be told written after it yet."""


async def _head_by(reader: StreamReader, at: datetime) -> int:
    """The head, for a start time after everything stored: once that time has passed by the
    store's clock (what comes next is written after it); before, the connector waits (what
    comes until then is written before it)."""
    row = await (await reader.conn.execute("SELECT now()")).fetchone()
    if row is not None and at > row[0]:
        raise StartToCome(said("connector %s: its start_position time %s is still to come (the "
                               "store's clock: %s); it starts then", reader.connector,
                               at.isoformat(), row[0].isoformat()))  # fmt: skip
    return await reader.head()


async def tell_deleted(reader: StreamReader, seq: int, start: Any) -> None:
    """A connector's first cursor, at ``seq`` from ``start``, that begins before the first
    event retention kept: said once (by the shard that made the shards' cursors, whichever
    started first), as nothing is lost silently; it goes on at the first kept. ``beginning``
    means every retained message: nothing to say."""
    if start == "beginning" or reader.stream != "events":
        return
    q = sql.SQL("SELECT name, coalesce((SELECT min(first_seq) FROM {} WHERE sync_id = %s),"
                " events_seq + 1) FROM {} WHERE sync_id = %s").format(
        reader.store.table("event_batches"), reader.store.table("sources"))  # fmt: skip
    row = await (await reader.conn.execute(q, (reader.sync_id, reader.sync_id))).fetchone()
    if row is not None and seq + 1 < row[1]:
        log.warning(said("connector %s: its start_position begins in events %d to %d of source "
                         "%s, which retention deleted (store.events_retention); it starts at "
                         "the first kept, %d", reader.connector, seq + 1, row[1] - 1, row[0],
                         row[1]))  # fmt: skip


def epoch(ts: str) -> float:
    """Epoch seconds of a time as messages write it."""
    return datetime.fromisoformat(ts).timestamp()
