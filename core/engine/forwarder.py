"""The forwarding engine: moves a connector's stream from the store to its sink (docs/design.md
“Guarantees”).

Rules it keeps, for every sink alike:
- per-record order: at most one unacknowledged message per group key; the group's next
  message waits (on the records stream, waiting versions collapse to the newest);
- the cursor of a source moves only past messages the broker acknowledged (or that went to
  the failed list), and with it is saved where the broker was (``Sink.mark``), so that after
  a restart the messages the broker took since are read back and not sent again;
- a failing message blocks only its group; after ``max_attempts`` it goes to the failed list;
  one an operator asks to retry comes back through its group (behind what the group has out)
  and leaves the list once the broker took it;
- a message can never hold the connector in a reconnect loop: the messages of a batch whose
  connection was lost (or whose acks never came) are suspects, sent alone once it is back; a
  suspect that loses the connection alone ``max_attempts`` times (3 by default) is charged
  with it and goes to the failed list;
- bounded: at most ``max_pending`` messages read ahead and ``max_in_flight`` batches out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence

from core.config.connector import ConnectorBase
from core.engine.ports import Commits, Reader, Source
from core.engine.rules import Suspects
from core.engine.session import Session
from core.engine.sink import Sink
from core.failures import AWAY, for_good
from core.metrics import Metrics
from core.redact import Said
from core.registry import make_sink
from core.shards import UNSPLIT, Shard
from core.store import Store
from core.store.cursors import ConnectorGone, started
from core.store.reader import StreamReader
from core.store.selection import selection

log = logging.getLogger("weir.engine")


class Refused(Exception):
    """A connector of the config file that its destination turned away for good (wrong
    credentials) before it ever connected (here or in an earlier run: it has no cursor yet):
    ``weir run`` ends with this line, as it does for a source. One made over the API, or one
    that connected before, retries instead."""


class Forwarder:
    """Runs one connector: supervises a session, and starts a new one after any failure.

    A new session starts from the saved cursors and reads back from the broker what it took
    since, so a failure anywhere (broker, store, this process) neither loses nor repeats.

    Each session makes its sink with ``open_sink`` (the connector type's, by default) and a
    reader per source with ``open_reader`` (a :class:`StreamReader` of ``store``, by default);
    unit tests pass in-memory doubles instead (tests/helpers/fake_sink.py, fake_store.py).
    """

    def __init__(
        self,
        connector: ConnectorBase,
        sources: Sequence[Source],
        store: Store | None,
        notifier: Commits,
        metrics: Metrics | None = None,
        *,
        open_sink: Callable[[ConnectorBase], Sink] = make_sink,
        open_reader: Callable[[Source], Reader] | None = None,
        shard: Shard = UNSPLIT,
        step_timeout: float = 1.0,
    ) -> None:
        self.cfg = connector
        self.step_timeout = step_timeout  # functions.timeout: how long a step's call may run
        self.shard = shard
        self.name = shard.key(connector.name)  # in logs, metrics and weir status
        self.metrics = metrics or Metrics()
        self.sources = sources
        self.store = store
        self.notifier = notifier
        self.open_sink = open_sink
        self.open_reader = open_reader or self._store_reader
        self.kick = asyncio.Event()  # something to do: a batch finished, a source committed
        self.notified = False
        self.state = "starting"
        self.detail = ""
        self.said = False  # that start_position no longer applies
        self.had = False  # its cursors: a later session finding none stops (ConnectorGone)
        self.reached = False  # a session of this process reached its broker
        self.suspects = Suspects()  # kept across sessions: they charge a lost connection

    def _store_reader(self, src: Source) -> Reader:
        assert self.store is not None, "a Forwarder without a store is given open_reader"
        cfg = self.cfg
        where = selection(cfg.collections, cfg.actions, cfg.filters)
        return StreamReader(self.store, cfg.name, cfg.stream, where, str(src.sync_id),
                            src.provider, self.shard, fenced=True, incarnation=cfg.incarnation,
                            end=cfg.head_when_made(str(src.sync_id)))  # fmt: skip

    def set_state(self, state: str, detail: str = "") -> None:
        detail = " ".join(detail.split())  # one line, whatever the error's text holds
        if state != self.state:
            self.state = state
            level = logging.WARNING if state == "reconnecting" else logging.INFO  # not silent at
            # WARNING: a refusal a connector that ran before retries (found by an outside tryout)
            # A connect's detail is the last attempt's error, said already as it reconnected.
            said = f" ({detail})" if detail and state != "connecting" else ""
            log.log(level, "connector %s: %s%s", self.name, Said(state), said)
        self.detail = detail

    async def _may_end_the_run(self) -> bool:
        """A refusal for good ends ``weir run`` only for a connector of the file that never
        reached its broker, neither in a session of this process (``reached``) nor before (a
        cursor with a broker mark). One that did (a worker restarted, or a new ``weir run``
        after its password changed on the broker) retries, as it would have, saying why in
        ``weir status``."""
        if self.reached or self.cfg.incarnation is not None:
            return False
        if self.store is None:
            return True
        try:
            return not await asyncio.to_thread(started, self.store, self.cfg.name)
        except AWAY:  # the store is away too: retry, and ask again at the next refusal
            return False

    def _on_commit(self) -> None:
        self.notified = True
        self.kick.set()

    async def run(self, stop: asyncio.Event) -> None:
        for src in self.sources:
            self.notifier.subscribe(str(src.sync_id), self._on_commit)
        attempt = 0
        while not stop.is_set() and self.state != "deleted":  # deleted: none starts again
            session = Session(self, stop)
            try:
                await session.run()
                return
            except ConnectorGone as e:  # deleted: its cursors are no more, and nor is it
                self.set_state("deleted", str(e))
                return
            except Exception as e:  # any failure: a new session from the saved cursors
                why = for_good(e)
                if why is not None and await self._may_end_the_run():
                    self.state, self.detail = "failed", why  # said once by its runner
                    raise Refused(why) from None
                attempt = 1 if session.delivered else attempt + 1
                delay = self.cfg.retry.delay(attempt, random.random())
                self.set_state("reconnecting", f"{type(e).__name__}: {e}; retry in {delay:.1f}s")
                log.debug("connector %s: session failed", self.name, exc_info=True)
            finally:
                await session.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
