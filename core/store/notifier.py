"""Commit notifications for connectors and the Consume API: the engine's ``Commits``
(core/engine/ports.py), from the store's NOTIFY channel (core/store/shared.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.pq.abc import PGconn

from core.store import SESSION, Store
from core.store.shared import channel


class Notifier:
    """Wakes connectors when a source commits to the store (LISTEN on one connection), and
    keeps the heads of each source's streams the commits announced (``heads``), so that a
    connector caught up need not ask for them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.heads: dict[str, tuple[int, int]] = {}  # by sync id: events seq, records seq
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, sync_id: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in the event loop) after each commit of the source."""
        self._subscribers.setdefault(sync_id, []).append(callback)

    def unsubscribe(self, sync_id: str, callback: Callable[[], None]) -> None:
        self._subscribers.get(sync_id, []).remove(callback)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="weir-notifier")

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.store.url, autocommit=True, application_name="weir:notify",
                    options=SESSION,
                ) as conn:  # fmt: skip
                    await conn.execute(
                        sql.SQL("LISTEN {}").format(sql.Identifier(channel(self.store.schema)))
                    )
                    for callbacks in self._subscribers.values():  # missed while not listening
                        for callback in callbacks:
                            callback()
                    await self._heard(conn.pgconn)
            except psycopg.OperationalError:
                await asyncio.sleep(1.0)  # readers poll meanwhile

    async def _heard(self, pgconn: PGconn) -> None:
        """Take the notifications off the connection's socket as they come, until it fails.
        Read here, a notification costs ~30 us of CPU; through psycopg's ``notifies()``
        (its generator and waits) it cost ~190, once for every store write."""
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                pgconn.consume_input()
            except psycopg.OperationalError as e:  # the server went away: libpq closed the
                loop.remove_reader(fd)  # socket, whose number another connection may take next
                lost.set_exception(e)
                return
            while (n := pgconn.notifies()) is not None:
                self._tell(n.extra.decode(errors="replace"))

        fd = pgconn.socket
        loop.add_reader(fd, readable)
        try:
            await lost
        finally:
            if lost.cancelled():  # stopped: the socket is still this connection's
                loop.remove_reader(fd)

    def _tell(self, payload: str) -> None:
        """A commit of a source: ``sync_id:events_seq:records_seq`` (heads left out when the
        payload is not Weir's own)."""
        sid, _, heads = payload.partition(":")
        events, _, records = heads.partition(":")
        if events.isdecimal() and records.isdecimal():
            self.heads[sid] = (int(events), int(records))
        for callback in self._subscribers.get(sid, ()):
            callback()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
