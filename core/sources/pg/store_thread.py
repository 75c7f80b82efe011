"""The store half of capture, on a thread of its own: one thread and one FIFO, so batches
commit in the order given, and decoding the next batch overlaps the store's work on this one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

from core.store.writer import SourceWriter


class StoreThread:
    """Does the capture's store work on a thread, in the order given.

    Items are ``("write", changes)``, ``("commit", (commit_lsn, end_lsn))``, ``("flush",
    (changes, (commit_lsn, end_lsn)))`` (a write and its commit), ``("advance", end_lsn)``, and
    ``("backfill", ((schema, table), reason))``, ``("drop", (collection, lsn, idx,
    committed_at))``, ``("table", (collection, key, relid[, (schema, table)]))``,
    ``("shape", (collection, (schema, table), columns, unseen))`` and ``("refuse", (lsn, idx,
    collection, action, reason))``, which go with the next commit.
    On this thread ``on_stored(n)`` runs after each write and ``on_commit(end_lsn)`` after each
    commit or advance. A store error is raised in the capture thread at its next call. At
    most ``DEPTH`` items wait, so memory stays bounded.
    """

    DEPTH = 2  # enough to overlap decoding with writing; each item may hold max_batch changes

    def __init__(
        self,
        writer: SourceWriter,
        on_stored: Callable[[int], None],
        on_commit: Callable[[int], None],
    ) -> None:
        self.writer = writer
        self.on_stored = on_stored
        self.on_commit = on_commit
        self.queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(self.DEPTH)
        self.error: BaseException | None = None
        self.submitted = 0  # written by the capture thread only
        self.done = 0  # written by the store thread only
        self.abandon = False
        self.thread = threading.Thread(target=self._run, name="weir-store-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None and not self.abandon:
            kind, arg = item
            try:
                if kind == "flush":  # the usual: a write and its commit
                    changes, (commit_lsn, end_lsn) = arg
                    self.writer.write_commit(changes, commit_lsn, end_lsn)
                    self.on_stored(len(changes))
                    self.on_commit(end_lsn)
                elif kind == "write":
                    self.writer.write(arg)
                    self.on_stored(len(arg))
                elif kind == "commit":
                    self.writer.commit(*arg)
                    self.on_commit(arg[1])
                elif kind == "backfill":  # committed with what comes next
                    table, reason = arg
                    self.writer.collections.request_backfills([table], reason)
                elif kind == "drop":  # committed with what comes next
                    self.writer.drop(*arg)
                elif kind == "table":  # committed with what comes next
                    self.writer.collections.set_table(*arg)
                elif kind == "shape":  # committed with what comes next
                    self.writer.collections.set_shape(*arg)
                elif kind == "refuse":  # committed with what comes next
                    self.writer.refuse(*arg)
                else:
                    self.writer.advance(arg)
                    self.on_commit(arg)
            except BaseException as e:
                self.error = e
                return
            self.done += 1

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _put(self, item: tuple[str, Any] | None) -> None:
        while True:
            self._check()
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def submit(self, kind: str, arg: Any) -> None:
        self.submitted += 1
        self._put((kind, arg))

    def idle(self) -> bool:
        """Everything submitted is in the store."""
        self._check()
        return self.done == self.submitted

    def finish(self) -> None:
        """Wait until everything submitted is in the store."""
        self._put(None)
        self.thread.join()
        self._check()

    def abort(self) -> None:
        """Stop after the item in hand; what is not committed is dropped (sent again later)."""
        self.abandon = True
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        self.thread.join()
