"""What the forwarding engine needs, as contracts: from the store, a reader of one source's
stream (core/store/reader.py's ``StreamReader`` in production) and commit notifications
(``Notifier``), which unit tests give as in-memory doubles (tests/helpers/); from the connector
a session runs for, its ``Host`` (core/engine/forwarder.py's ``Forwarder``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from core.config.connector import ConnectorBase
from core.config.sources import HttpSource, PostgresSource
from core.engine.rules import Suspects
from core.engine.sink import Sink
from core.envelope import Message
from core.metrics import Metrics
from core.store.cursors import Cursor


class Reader(Protocol):
    """One connector's view of one source's stream, its cursor and its failed list. A session
    calls ``open()`` before anything else and ``close()`` last; a new session gets a new one.
    """

    sync_id: str

    async def open(self) -> None:
        """Called once, when the session starts; the other methods need it done."""

    async def close(self) -> None:
        """Called once, when the session ends (also after a failed ``open()``)."""

    async def head(self) -> int:
        """Called when the read-ahead caught up: the last seq committed to the stream."""

    async def cursor(self, start: Any, had: bool = False) -> Cursor:
        """Called once after ``open()``: the saved cursor and broker mark, or on the
        connector's first start a new cursor from ``start`` (its ``start_position``); when
        the connector ``had`` a cursor and none is left, ConnectorGone: it was deleted."""

    async def fetch(self, after: int, upto: int, limit: int) -> list[Message]:
        """Called to read ahead: at most ``limit`` selected messages with
        ``after < seq <= upto``, in seq order. Each call returns new ``Message`` objects."""

    async def save(self, seq: int, state: dict[str, Any]) -> None:
        """Called when the cursor moved: every message up to ``seq`` is settled (acknowledged,
        on the failed list or superseded); ``state`` holds the broker mark from before
        anything after ``seq`` was sent."""

    async def fail(self, msg: Message, error: str) -> None:
        """Called when a message goes to the failed list, before the cursor may pass it; a
        message failed again (after a restart) replaces its earlier entry."""

    async def retries(self, limit: int) -> tuple[list[Message], list[int]]:
        """Called every poll: failed messages (of the connector's shard) an operator asked to
        send again, marked ``replay`` (at most ``limit``), and the seqs of those a newer version
        of their record replaced."""

    async def resolve(self, seqs: list[int]) -> None:
        """Called at a save: take these seqs' entries off the failed list (sent again, or
        replaced)."""

    def fence_lost(self) -> bool:
        """Called before each dispatch: True once the store ended the session that holds the
        connector's fence (core/store/cursors.py), when nothing more may be sent."""


class Commits(Protocol):
    """Commit notifications: ``subscribe`` is called once per source when a connector starts;
    ``callback`` runs in the event loop after each commit of that source. ``heads``: by sync
    id, the (events, records) seqs the last commit heard of made the streams' heads."""

    heads: dict[str, tuple[int, int]]

    def subscribe(self, sync_id: str, callback: Callable[[], None]) -> None: ...


Source = PostgresSource | HttpSource


class Host(Protocol):
    """What a session takes from and keeps in the connector it runs for, across its sessions
    (core/engine/forwarder.py's ``Forwarder``)."""

    cfg: ConnectorBase
    name: str  # in logs, metrics and weir status
    metrics: Metrics
    sources: Sequence[Source]
    notifier: Commits
    open_sink: Callable[[ConnectorBase], Sink]
    open_reader: Callable[[Source], Reader]
    kick: asyncio.Event  # something to do: a batch finished, a source committed
    notified: bool  # a commit came since the session last read
    state: str
    detail: str
    said: bool  # that start_position no longer applies
    had: bool  # its cursors: a session finding none then stops (ConnectorGone)
    reached: bool  # a session reached its broker (a refusal then may not end the run)
    suspects: Suspects  # the messages that lost a connection, and how often
    step_timeout: float  # how long one call of a function of its steps may run

    def set_state(self, state: str, detail: str = "") -> None: ...
