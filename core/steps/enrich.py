"""An enrich step (docs/transforms.md “Enrich”): one query a batch against each message's source
database, whose rows join the messages by a key, each message's row put in a field of its
record (null when it has none). A join without another service, as Sequin's enrichment.

- The keys are the values of ``key`` in the batch's messages, distinct, sent as ``%(ids)s``, a
  ``text[]`` (``WHERE id = ANY(%(ids)s::int[])``, or ``id::text = ANY(%(ids)s)``): one type
  whatever the messages hold.
- The row is what ``to_jsonb`` makes of it, read with every number exact.
- A query that fails (the database away, the query wrong) fails the batch's messages
  retryably: the connector retries them with its backoff and says why (after
  ``retry.max_attempts``, they go to the failed list); it never sends one unenriched.
- Each source's connection is opened when first needed, with a statement timeout, read-only,
  and opened again after an error.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import psycopg

from core.engine.sink import RetryableError
from core.envelope import Message
from core.redact import first_line, said
from core.steps import expr
from core.steps.compile import EnrichAt, StepFailed, parts
from core.steps.payload import load

QUERY_TIMEOUT_MS = 10_000


class Enrich:
    def __init__(self, at: EnrichAt, sources: dict[str, str]) -> None:
        """``sources``: each Postgres source's URL by sync id."""
        self.name, self.spec, self.flat = at.name, at.spec, at.flat
        self.key = expr.path(at.spec.key)
        self.sources = sources
        self.conns: dict[str, psycopg.AsyncConnection[Any]] = {}
        self.lock = asyncio.Lock()
        # the user's query, each row as its JSON text
        self.query = f"SELECT to_jsonb(q)::text FROM ({at.spec.sql}) q"

    async def merge(self, batch: Sequence[Message], states: list[Any]) -> None:
        """Put each live message's row (or null) in its record, source by source; a query that
        fails fails the source's live messages retryably."""
        by_source: dict[str, list[int]] = defaultdict(list)
        for i, state in enumerate(states):
            if isinstance(state, tuple):
                by_source[batch[i].sync_id].append(i)
        for sync_id, places in by_source.items():
            keys: dict[int, str | None] = {}
            for i in places:
                try:
                    k = self.key(*parts(states[i][0]), states[i][0])
                    keys[i] = None if k is None else expr.text_of(k)
                except Exception as e:  # a value no text is made of: this message alone
                    states[i] = StepFailed(
                        said("%s: %s: %s", self.name, type(e).__name__, first_line(e))
                    )
            places = [i for i in places if i in keys]
            ids = sorted({k for k in keys.values() if k is not None})
            try:
                rows = await self._rows(sync_id, ids)
            except (psycopg.Error, OSError, ValueError) as e:
                why = RetryableError(said("%s: the query failed: %s", self.name, first_line(e)))
                for i in places:
                    states[i] = why
                continue
            found: dict[str, bytes] = {}
            for row in (text.encode() for text in rows):  # each message loads its own copy
                found[expr.text_of(load(row).get(self.spec.on))] = row
            for i in places:
                record = states[i][0] if self.flat else states[i][0].get("record")
                if type(record) is dict:  # a row of its own: a later step may change it
                    k = keys[i]
                    got = None if k is None else found.get(k)
                    record[self.spec.into] = None if got is None else load(got)

    async def _rows(self, sync_id: str, ids: list[str]) -> list[str]:
        if not ids:
            return []
        url = self.sources.get(sync_id)
        if url is None:
            raise ValueError(said("source %s is no Postgres database to query", sync_id))
        async with self.lock:  # one query at a time: batches in flight share the connection
            return await self._query(sync_id, url, ids)

    async def _query(self, sync_id: str, url: str, ids: list[str]) -> list[str]:
        conn = self.conns.get(sync_id)
        if conn is None or conn.closed:
            conn = self.conns[sync_id] = await psycopg.AsyncConnection.connect(
                url, autocommit=True, application_name="weir:enrich",
                options=f"-c statement_timeout={QUERY_TIMEOUT_MS} "
                        "-c default_transaction_read_only=on",
            )  # fmt: skip
        try:
            cur = await conn.execute(self.query, {"ids": ids})
            return [str(r[0]) for r in await cur.fetchall()]
        except psycopg.Error:
            await conn.close()  # opened again for the next batch
            raise

    async def close(self) -> None:
        for conn in self.conns.values():
            await conn.close()
        self.conns.clear()
