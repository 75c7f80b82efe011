"""Where a Spark query of Weir's streams is, in the store (docs/spark.md “What a query keeps”):
the stream's bounds a query starts from and reads up to, and a named query's position, the
cursor ``spark:NAME`` that retention waits for and ``weir status`` lists."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

from core.failures import postgres_unreachable
from core.store import starts
from core.store.cursors import SPARK_PREFIX
from core.store.reader import StreamReader
from core.store.selection import selection
from spark.options import Spec
from spark.typed import SourceError


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def opened(spec: Spec) -> StreamReader:
    """A reader of the spec, connected to the store; a store that does not answer fails the
    query with one line saying so (Spark shows the data source's message as it is)."""
    where = selection(list(spec.collections), spec.actions, [])  # type: ignore[arg-type]
    name = SPARK_PREFIX + (spec.name or "reader")
    reader = StreamReader(spec.store, name, spec.stream, where, spec.sync_id, spec.provider)
    try:
        await reader.open()
    except psycopg.OperationalError as e:
        raise SourceError(str(postgres_unreachable(e, spec.store.url, "the store"))) from None
    return reader


async def bounds(spec: Spec, start: bool = True) -> tuple[int, int]:
    """(where the start option begins: the last seq before it, the stream's head). A start in
    events retention deleted fails when they are read, naming them (``_present`` in
    spark/source.py); a start time still to come begins at the head (a batch read of it is
    empty)."""
    reader = await opened(spec)
    try:
        head = await reader.head()
        if not start:
            return head, head
        return await starts.start_seq(reader, spec.start), head
    except starts.StartToCome:
        return head, head
    finally:
        await reader.close()


class Position:
    """A named query's position in the store, kept by one run of it (a query's driver): the
    run's first note takes the cursor over (the query started again, after a stop or a kill),
    and a later one fails once another run took it since: two queries of one name would
    otherwise move one position back and forth, and retention could delete what the one
    behind has still to read."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.holder = uuid.uuid4().hex  # this run
        self.noted = -1  # the position last kept

    def note(self, seq: int) -> None:
        """Keep ``seq`` (or the later one kept already); called before each micro-batch too, so
        a query whose name another run took fails before it reads another batch. A note opens
        a connection of its own: 3.5 ms (1.3 ms of CPU) on the development machine, against a
        micro-batch's 100 ms and more, so none is kept open across triggers."""
        if self.spec.name is not None:
            run(self._put(max(seq, self.noted)))
            self.noted = max(seq, self.noted)

    async def _put(self, seq: int) -> None:
        reader = await opened(self.spec)
        try:
            held = await reader.cursors.put(reader.conn, seq, self.holder, self.noted < 0)
        finally:
            await reader.close()
        if not held:
            raise SourceError(
                f"another query named {self.spec.name!r} of source {self.spec.source} started "
                "since this one and keeps the position now: give each query its own name "
                "(option name)"
            )
