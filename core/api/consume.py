"""The Consume API's engine (docs/consume-api.md “Consume API”): HTTP pull consumers over the stream
store.

Each consumer has a queue in the store (``consumer_messages``): a filler task moves the
consumer's selection of each source's stream into it, behind a cursor like a connector's, and
workers receive, ack and nack rows of it. Payloads stay in the streams and are joined in when
a row is delivered. All state is in Postgres, so several workers, several Weir processes and
restarts share one view (the SQL is core/store/consumers.py; this module decides when):

- a delivered row is invisible until ``not_visible_until`` (the visibility timeout) and
  outstanding until acked (deleted) or nacked (visible at once); ``max_ack_pending`` caps the
  outstanding rows, also those whose visibility ran out (they are delivered again freely);
- only the lowest row of a group is deliverable, so a group's next message waits until the one
  before it is acknowledged;
- receives of one consumer are serialised by an advisory lock, which makes ``max_ack_pending``
  exact and the selection simple; a receive is one call of a SQL function
  (``consumer_receive``, core/store/functions.py), so the lock is held only while the server
  works; ack and nack do not take it;
- a records-stream row whose version was superseded before delivery is dropped when it comes
  up, with the other superseded rows of its group, and the receive tried again: the newer
  version is queued behind it, and the records stream only serves the latest.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from psycopg_pool import AsyncConnectionPool

from core.config.model import ConsumerConfig, UnknownSourceError, WeirConfig
from core.config.steps import flat_before
from core.engine.sink import RetryableError
from core.envelope import Message
from core.errors import Busy, Conflict, Invalid, InvalidField, NotFound
from core.redact import said
from core.steps import functions
from core.steps.payload import dump, load
from core.steps.run import Steps, enrich_sources
from core.store import Store
from core.store.consumers import Delivery, Filler, Queues, consumer_key
from core.store.notifier import Notifier
from core.store.reader import StreamReader
from core.store.selection import selection

log = logging.getLogger("weir.consume")

POLL = 1.0  # seconds between fills when no commit notification arrives
WAKE = 0.25  # seconds between receive attempts while a receive long-polls
BATCH = 10  # messages a receive asks for when it names no batch size
MAX_BATCH = 1000
MAX_WAIT_MS = 60_000
INFO_TTL = 1.0  # seconds an info count is reused
SWEEP_EVERY = 30.0  # seconds between sweeps of messages that used up max_deliver
_TOKEN = struct.Struct(">qi")  # row id, delivery number


def encode_token(row_id: int, delivery: int) -> str:
    """An ack token names one delivery of one row: a stale token acks nothing."""
    return base64.urlsafe_b64encode(_TOKEN.pack(row_id, delivery)).decode().rstrip("=")


def decode_tokens(tokens: list[str], field_name: str) -> tuple[list[int], list[int]]:
    """(row ids, delivery numbers) of ack tokens; :class:`Invalid` names one not issued here."""
    ids: list[int] = []
    deliveries: list[int] = []
    for i, token in enumerate(tokens):
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            row_id, delivery = _TOKEN.unpack(raw)
        except (ValueError, struct.error, UnicodeEncodeError):
            raise Invalid(
                said("%s[%s]: %r is not a token this API issued", field_name, i, token[:40])
            ) from None
        ids.append(row_id)
        deliveries.append(delivery)
    return ids, deliveries


@dataclass
class _Live:
    """A consumer this process serves: its config, filler and waiting receivers."""

    cfg: ConsumerConfig
    readers: dict[str, StreamReader]
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # receivers: rows to try
    fill: asyncio.Event = field(default_factory=asyncio.Event)  # filler: a source committed
    waiting: int = 0
    filler: asyncio.Task[None] | None = None
    info: tuple[float, dict[str, int]] = (0.0, {})
    steps: Steps | None = None
    held: bool = False  # the last receive's steps held its messages back (a query failed)


class Consumers:
    """Every HTTP pull consumer of the store, served by this process."""

    def __init__(self, cfg: WeirConfig, store: Store, pool: AsyncConnectionPool[Any]) -> None:
        self.cfg = cfg
        self.store = store
        self.queues = Queues(store, pool)
        self.notifier = Notifier(store)
        self.live: dict[str, _Live] = {}
        self._serving = asyncio.Lock()
        self.closing = False  # the API is stopping: long polls end now, with what they have

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Declare the YAML consumers, then serve every consumer the store holds."""
        stored = await self.queues.declare(self.cfg.consumers)
        for c in self.cfg.consumers:
            was = stored.get(c.name)
            if was is not None and was.stream != c.stream:
                raise ValueError(
                    said(
                        "consumer %r: its stream cannot change from %r; delete it or "
                        "give it another name",
                        c.name,
                        was.stream,
                    )
                )
        await self.notifier.start()
        for config in stored.values():
            await self._serve(config)

    async def stop(self) -> None:
        for live in list(self.live.values()):
            await self._unserve(live)
        self.live.clear()
        await self.notifier.stop()

    async def _serve(self, cfg: ConsumerConfig) -> _Live:
        """Serve a consumer here (once, also when requests for it race)."""
        async with self._serving:
            live = self.live.get(cfg.name)
            return live if live is not None else await self._start_serving(cfg)

    async def _start_serving(self, cfg: ConsumerConfig) -> _Live:
        where = selection([cfg.filters.collection_id], None, [], [cfg.filters.resource_id])
        readers = {}
        for src in self.cfg.sources_of(cfg):
            sid = str(src.sync_id)
            reader = StreamReader(
                self.store, consumer_key(cfg.name), cfg.stream, where, sid, src.provider
            )
            await reader.open()
            await reader.cursor("beginning" if cfg.deliver_policy == "all" else "end")
            readers[sid] = reader
        live = _Live(cfg, readers)
        if cfg.steps:
            live.steps = Steps(cfg.steps, {}, cfg.stream == "records",
                               self.cfg.functions.timeout.total_seconds(),
                               enrich_sources(self.cfg.sources_of(cfg)),
                               owner=f"consumer {cfg.name}")  # fmt: skip
        self.live[cfg.name] = live
        filler = Filler(self.store, cfg)
        live.filler = asyncio.create_task(self._fill(live, filler), name=f"fill-{cfg.name}")
        for sid in readers:
            self.notifier.subscribe(sid, live.fill.set)
        return live

    async def _unserve(self, live: _Live) -> None:
        for sid in live.readers:
            self.notifier.unsubscribe(sid, live.fill.set)
        if live.filler is not None:
            live.filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live.filler
        for reader in live.readers.values():
            await reader.close()
        if live.steps is not None:
            await live.steps.close()

    # -- management -----------------------------------------------------------------------

    async def create(self, cfg: ConsumerConfig) -> ConsumerConfig:
        """Store and serve a consumer POSTed to the API; refused when a source it names is
        not in the config, or its name is taken."""
        try:
            self.cfg.sources_of(cfg)
        except UnknownSourceError as e:
            raise InvalidField(str(e), loc=("body", "sources")) from None
        if not await self.queues.create(cfg):
            raise Conflict(said("a consumer named %r exists", cfg.name))
        await self._serve(cfg)
        return cfg

    async def listing(self, name: str | None = None) -> list[tuple[ConsumerConfig, str]]:
        """(config, origin) of every consumer in the store, or of the one named."""
        return await self.queues.listing(name)

    async def get(self, name: str) -> _Live:
        """The consumer, served here from now on if another process created it."""
        live = self.live.get(name)
        if live is not None:
            return live
        found = await self.queues.listing(name)
        if not found:
            raise NotFound(said("no consumer named %r", name))
        return await self._serve(found[0][0])

    async def delete(self, name: str) -> None:
        """Stop serving a consumer made over the API and delete it with its queue."""
        live = await self.get(name)
        if name in {c.name for c in self.cfg.consumers}:
            raise Conflict(
                said("consumer %r is declared in the config file; remove it there", name)
            )
        await self._unserve(self.live.pop(name))
        await self.queues.delete(name)
        live.wake.set()

    # -- the queue ------------------------------------------------------------------------

    async def _fill(self, live: _Live, filler: Filler) -> None:
        """Move the consumer's selection of each stream into its queue, for as long as served."""
        name = live.cfg.name
        failing = False
        while True:
            moved = 0
            try:
                for reader in live.readers.values():
                    count = await filler.step(reader)
                    if count is None:  # the queue is full
                        break
                    moved += count
            except Exception as e:  # the store went away: try again
                if not failing:
                    log.warning("consumer %s: filling its queue failed: %s", name, e)
                failing = True
                await asyncio.sleep(POLL)
                with contextlib.suppress(Exception):
                    for reader in live.readers.values():
                        if reader.conn.closed:
                            await reader.open()
                continue
            if failing:
                log.info("consumer %s: filling its queue again", name)
                failing = False
            if moved:
                live.wake.set()
                continue
            live.fill.clear()  # a full queue is looked at again after POLL
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.fill.wait(), POLL)

    async def receive(self, name: str, batch_size: int, wait_for: int) -> list[Delivery]:
        """Up to ``batch_size`` messages, waiting up to ``wait_for`` ms for the first."""
        if not 1 <= batch_size <= MAX_BATCH:
            raise Invalid(said("batch_size must be between 1 and %s", MAX_BATCH))
        if not 0 <= wait_for <= MAX_WAIT_MS:
            raise Invalid(said("wait_for must be between 0 and %s (ms)", MAX_WAIT_MS))
        live = await self.get(name)
        if live.waiting >= live.cfg.max_waiting:
            raise Busy(
                said("consumer %r has %s receive calls waiting (max_waiting)", name, live.waiting)
            )
        live.waiting += 1
        try:
            deadline = time.monotonic() + wait_for / 1000
            while True:
                live.wake.clear()  # set again by anything that may make a message deliverable
                live.held = False
                got = await self._receive_once(live, batch_size)
                left = deadline - time.monotonic()
                if (
                    got or left <= 0 or self.closing or self.live.get(name) is not live or live.held
                ):  # a step's query failed: not tried again in this call
                    return got
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(live.wake.wait(), min(left, WAKE))
        finally:
            live.waiting -= 1

    async def _receive_once(self, live: _Live, batch_size: int) -> list[Delivery]:
        """A receive. While the steps run the messages are hidden for as long as they may take
        too (``Steps.bound``); then each one's ``ack_wait_ms`` starts, and one delivered again
        meanwhile (the steps outran it) is given to that receive alone (it went to two
        workers: found by an outside tryout)."""
        cfg, steps = live.cfg, live.steps
        hide_ms = cfg.ack_wait_ms
        if steps is not None:
            hide_ms += math.ceil(steps.bound(batch_size) * 1000)
        got, dead = await self.queues.receive(cfg, live.readers, batch_size, hide_ms)
        _failed(live, dead)
        if steps is not None and got:
            got = await self._stepped(live, steps, got)
        if steps is not None and got:
            ours = await self.queues.restamp(cfg, [d.row_id for d in got],
                                             [d.deliveries for d in got])  # fmt: skip
            got = [d for d in got if d.row_id in ours]
        for d in got:
            d.token = encode_token(d.row_id, d.deliveries)
        return got

    async def _stepped(self, live: _Live, steps: Steps, got: list[Delivery]) -> list[Delivery]:
        """The deliveries as the consumer's steps make them; those they drop are done with (as
        if acked) and those they fail go to the failed list, so the next of each group is
        deliverable. An enrich query that fails makes them visible again, and says why."""
        try:
            outcomes: list[Any] = await steps.apply([d.message for d in got])
        except Exception as e:  # a step's query, say: the next receive tries again
            outcomes = [RetryableError(str(e))] * len(got)
        kept: list[Delivery] = []
        dropped: list[Delivery] = []
        failed: list[tuple[Delivery, str]] = []
        held: list[tuple[Delivery, Exception]] = []
        flat = flat_before(live.cfg.steps)[-1]
        for d, o in zip(got, outcomes, strict=True):
            if o is None:
                dropped.append(d)
            elif isinstance(o, RetryableError):  # an enrich query failed: not the message's fault
                held.append((d, o))
            elif isinstance(o, Exception):
                failed.append((d, f"{type(o).__name__}: {o}"))
                log.warning("consumer %s: message %s moved to the failed list: %s",
                            live.cfg.name, d.message.key, o)  # fmt: skip
            else:
                if o.payload is not d.message.payload:  # the steps rewrote it (not a filter alone)
                    _shape(d, o, flat)
                kept.append(d)
        if held:  # visible again at once, as if never delivered
            await self.queues.unreceive(live.cfg.name, [d.row_id for d, _ in held],
                                        [d.deliveries for d, _ in held])  # fmt: skip
            log.warning("consumer %s: %s; its messages wait for the next receive",
                        live.cfg.name, held[0][1])  # fmt: skip
            live.held = True
        if dropped or failed:
            await self.queues.finish(live.cfg, dropped, failed)
            live.wake.set()  # the next of their groups may be deliverable now
        return kept

    async def sweep(self) -> int:
        """Move messages delivered ``max_deliver`` times whose visibility ran out to the failed
        list, also when no worker asks for more (scheduled every ``SWEEP_EVERY``).
        """
        moved = 0
        for live in list(self.live.values()):
            if live.cfg.max_deliver <= 0:
                continue
            count, dead = await self.queues.sweep(live.cfg, live.readers, MAX_BATCH)
            _failed(live, dead)
            moved += count
        return moved

    async def settle(self, name: str, tokens: list[str], ack: bool, field_name: str) -> int:
        """Ack (delete) or nack (make visible now) deliveries; returns how many matched.

        A token of an earlier delivery of a message that was redelivered since matches nothing.
        """
        live = await self.get(name)
        ids, deliveries = decode_tokens(tokens, field_name)
        count = await self.queues.settle(name, ids, deliveries, ack)
        live.wake.set()
        return count

    async def retried(self, name: str) -> None:
        """Messages of the consumer's failed list are back in its queue: waiting receivers may
        take them, and its steps run the functions as their files are now."""
        (await self.get(name)).wake.set()
        functions.relook()

    async def info(self, name: str) -> dict[str, int]:
        """``num_pending`` (waiting) and ``num_ack_pending`` (outstanding), counted at most
        once a second.
        """
        live = await self.get(name)
        at, counts = live.info
        if time.monotonic() - at < INFO_TTL:
            return counts
        pending, ack_pending = await self.queues.counts(name)
        counts = {"num_pending": pending, "num_ack_pending": ack_pending}
        live.info = (time.monotonic(), counts)
        return counts


def _failed(live: _Live, dead: list[Delivery]) -> None:
    for d in dead:
        log.warning(
            "consumer %s: message %s moved to the failed list after %d deliveries",
            live.cfg.name, d.message.key, d.deliveries,
        )  # fmt: skip


def _shape(d: Delivery, m: Message, flat: bool) -> None:
    """``d`` carrying what steps made of its message: its payload as is (sequin_streams), and
    the record and changes the families that show them apart take from it; when the steps
    flatten the message, it is the record (no changes)."""
    d.message = m
    shaped = load(m.payload)
    if flat or not isinstance(shaped, dict) or "record" not in shaped:
        d.record, d.changes = m.payload.decode(), None
        return
    d.record = dump(shaped["record"]).decode()
    d.changes = None if shaped.get("changes") is None else dump(shaped["changes"]).decode()
