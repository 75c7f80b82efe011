"""The store's side of the forwarding engine in memory, for unit tests only: each source's
stream, one connector's cursors and failed list, and commit notifications. It implements
core/engine/ports.py's ``Reader`` and ``Commits`` as core/store/reader.py does against Postgres.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from core.config.connector import SeqStart
from core.config.sources import HttpSource
from core.envelope import Message, event_key, group_key, record_key
from core.store.cursors import ConnectorGone, Cursor, CursorGone


class Failed(NamedTuple):
    """One entry of the failed list."""

    key: str
    attempts: int
    error: str


class FakeStore:
    """Streams of messages by source, and the connector's cursors (``cursors``: sync id ->
    seq and broker state) and failed list (``failed``: (sync id, seq) -> entry). ``saves``
    keeps every cursor save in order; ``on_save`` (if set) sees each as it happens.
    """

    def __init__(self, stream: str = "events", sources: int = 1) -> None:
        self.stream = stream
        self.sources = [HttpSource(kind="http", name=f"s{i}", provider="fake")
                        for i in range(1, sources + 1)]  # fmt: skip
        self.sync_ids = [str(s.sync_id) for s in self.sources]
        self.rows: dict[str, list[Message]] = {sid: [] for sid in self.sync_ids}
        self.cursors: dict[str, tuple[int, dict[str, Any] | None]] = {}
        self.starts: dict[str, int] = {}  # where each cursor was made (start_position)
        self.failed: dict[tuple[str, int], Failed] = {}
        self.retry: set[tuple[str, int]] = set()  # failed entries an operator asked to retry
        self.saves: list[tuple[str, int, dict[str, Any]]] = []
        self.on_save: Callable[[str, int, dict[str, Any]], None] | None = None
        self.callbacks: dict[str, list[Callable[[], None]]] = {}
        self.heads: dict[str, tuple[int, int]] = {}  # Commits.heads: none heard, always asked
        self.fence_lost = False  # the store ended the sessions holding the connector's fences

    def append(self, record_id: str, source: int = 0) -> Message:
        """Commit one change of record ``record_id`` to a source's stream (the first by
        default): an insert on the events stream, the record's new version on the records
        stream. Returns it (the engine gets copies)."""
        sid = self.sync_ids[source]
        seq = len(self.rows[sid]) + 1
        group = group_key(sid, "fake", "public:t", record_id)
        key = record_key(group, seq) if self.stream == "records" else event_key(sid, seq, 0)
        action = None if self.stream == "records" else "insert"
        payload = b'{"seq":%d}' % seq
        msg = Message(sid, "fake", seq, "public:t", action, group, key, payload)
        self.rows[sid].append(msg)
        return msg

    def commit(self) -> None:
        """Tell the subscribed connectors that sources committed (as the store's NOTIFY does)."""
        for callbacks in self.callbacks.values():
            for callback in callbacks:
                callback()

    def subscribe(self, sync_id: str, callback: Callable[[], None]) -> None:
        """``Commits.subscribe``: called by the engine once per source when it starts."""
        self.callbacks.setdefault(sync_id, []).append(callback)

    def reader(self, source: HttpSource) -> FakeReader:
        """A new reader of ``source``; pass ``store.reader`` as the engine's ``open_reader``."""
        return FakeReader(self, str(source.sync_id))

    def cursor(self, source: int = 0) -> int:
        """The source's saved cursor (0 before the first save)."""
        return self.cursors.get(self.sync_ids[source], (0, None))[0]


class FakeReader:
    """One session's reader of one source's stream in a :class:`FakeStore`."""

    def __init__(self, store: FakeStore, sync_id: str) -> None:
        self.store = store
        self.sync_id = sync_id
        self.opened = False

    async def open(self) -> None:
        """Called once, when the session starts."""
        self.opened = True

    async def close(self) -> None:
        """Called once, when the session ends."""
        self.opened = False

    def fence_lost(self) -> bool:
        """Before each dispatch: whether the test has cut the store's sessions."""
        return self.store.fence_lost

    def _rows(self) -> list[Message]:
        if not self.opened:
            raise RuntimeError("FakeReader used before open() or after close()")
        return self.store.rows[self.sync_id]

    async def head(self) -> int:
        """Called when the read-ahead caught up: the last seq committed."""
        return len(self._rows())

    async def cursor(self, start: Any, had: bool = False) -> Cursor:
        """Called once per session: the saved cursor, or a new one from ``start`` (none when
        the connector ``had`` one: it was deleted)."""
        rows = self._rows()
        saved = self.store.cursors.get(self.sync_id)
        if saved is not None:
            return Cursor(saved[0], saved[1])
        if had:
            raise ConnectorGone(f"source {self.sync_id}: the cursor was deleted")
        seq = {"beginning": 0, "end": len(rows)}.get(start) if isinstance(start, str) else None
        if seq is None:
            assert isinstance(start, SeqStart)
            seq = start.seq - 1
        self.store.cursors[self.sync_id] = (seq, None)
        self.store.starts[self.sync_id] = seq
        return Cursor(seq, None, new=True)

    async def fetch(self, after: int, upto: int, limit: int) -> list[Message]:
        """Called to read ahead: new copies of the messages ``after < seq <= upto``, at most
        ``limit``, as the real reader builds new ones from rows each time."""
        rows = self._rows()[after:upto][:limit]
        return [Message(m.sync_id, m.provider, m.seq, m.collection_id, m.action, m.group,
                        m.key, m.payload) for m in rows]  # fmt: skip

    async def save(self, seq: int, state: dict[str, Any]) -> None:
        """Called when the cursor moved (every 0.1 s at most, and when a session ends)."""
        self._rows()
        if self.sync_id not in self.store.cursors:
            raise CursorGone(f"source {self.sync_id}: the cursor was deleted")
        self.store.cursors[self.sync_id] = (seq, state)
        self.store.saves.append((self.sync_id, seq, state))
        if self.store.on_save is not None:
            self.store.on_save(self.sync_id, seq, state)

    async def fail(self, msg: Message, error: str) -> None:
        """Called when a message goes to the failed list; a second failure replaces the first."""
        self._rows()
        self.store.failed[(self.sync_id, msg.seq)] = Failed(msg.key, msg.attempts, error)
        self.store.retry.discard((self.sync_id, msg.seq))

    async def retries(self, limit: int) -> tuple[list[Message], list[int]]:
        """Every poll: copies of the failed messages asked to be retried, marked replay."""
        rows = self._rows()
        asked = sorted(seq for sid, seq in self.store.retry if sid == self.sync_id)[:limit]
        out = []
        for seq in asked:
            m = rows[seq - 1]
            out.append(Message(m.sync_id, m.provider, m.seq, m.collection_id, m.action, m.group,
                               m.key, m.payload, replay=True))  # fmt: skip
        return out, []

    async def resolve(self, seqs: list[int]) -> None:
        """At a save: these entries leave the failed list."""
        for seq in seqs:
            self.store.failed.pop((self.sync_id, seq), None)
            self.store.retry.discard((self.sync_id, seq))
