"""One session of a connector (core/engine/forwarder.py says the rules and restarts sessions):
its sink's connection, a lane per source, and the loop that reads, dispatches in batches,
settles acks and failures, sends again what an operator retried, and saves cursors; rebuilt
from the store when a new session starts."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import random
import time
from collections import deque

from core.config.connector import SeqStart
from core.engine.lane import Lane
from core.engine.ports import Host
from core.engine.rules import Groups
from core.engine.sink import BatchError, FatalError, ReadBack
from core.envelope import BrokerMark, Message, earliest, key_prefixes
from core.redact import said
from core.steps.run import Steps, enrich_sources
from core.store.cursors import FenceLost, NotNow

log = logging.getLogger("weir.engine")

PAGE = 2000  # rows per store read
SPAN = 200_000  # seqs scanned per store read, so that narrow filters stay cheap
POLL = 1.0  # seconds between store polls when no notification arrives
REPLAYS = 500  # failed messages asked to be retried, taken per source and poll
SAVE_EVERY = 0.1  # seconds between cursor saves
FENCE_SAID = 1.0  # seconds a session waits for its fence before its state says so


class Session:
    """One connection's worth of forwarding: state here is rebuilt from the store each time."""

    def __init__(self, fw: Host, stop: asyncio.Event) -> None:
        self.fw = fw
        self.cfg = fw.cfg
        self.stop = stop
        self.sink = fw.open_sink(fw.cfg)
        self.readable = self.sink if isinstance(self.sink, ReadBack) else None
        self.write = self.sink.write_batch
        self.steps: Steps | None = None
        if fw.cfg.steps:  # made anew each session: a changed function is imported again
            self.steps = Steps(fw.cfg.steps, type(fw.cfg).ROUTES, fw.cfg.stream == "records",
                               fw.step_timeout, enrich_sources(fw.sources),
                               owner=f"connector {fw.name}")  # fmt: skip
            self.write = functools.partial(self.steps.write, self.sink.write_batch)
        self.lanes = [Lane(fw.open_reader(s)) for s in fw.sources]
        self.groups: Groups[tuple[Lane, Message]] = Groups(collapse=fw.cfg.stream == "records")
        self.stream = 0 if fw.cfg.stream == "events" else 1  # its place in Commits.heads
        self.ready = self.groups.ready
        self.retries: list[tuple[float, int, Lane, Message]] = []
        self.tick = itertools.count()
        self.in_flight: set[asyncio.Task[None]] = set()
        self.done: deque[tuple[list[tuple[Lane, Message]], BaseException | None]] = deque()
        self.replaying: set[str] = set()  # keys of retried failed messages out in this session
        self.pending = 0  # messages read and not yet settled
        self.sent = 0  # messages in flight
        self.delivered = 0
        self.failing = False
        self.probing = False  # a suspect is out alone (Forwarder.suspects)
        m, name = fw.metrics, fw.name
        self.count_failed = m.failed.labels(name).inc
        self.count_retried = m.retried.labels(name).inc
        self.show_in_flight = m.in_flight.labels(name).set

    async def close(self) -> None:
        for task in self.in_flight:
            task.cancel()
        with contextlib.suppress(Exception):  # what is settled stays settled across a restart
            await self._save()
        with contextlib.suppress(Exception):  # before the fences go: a deleted connector's
            await self.sink.close()  # delete returns once they did (core/store/connectors.py)
        for lane in self.lanes:
            await lane.reader.close()
        if self.steps is not None:
            await self.steps.close()

    async def run(self) -> None:
        fw = self.fw
        # After a failed attempt, why it failed stays in view while the next one runs (a slow
        # connect would otherwise show no reason most of the time).
        last = fw.detail.rsplit("; retry in", 1)[0] if fw.state == "reconnecting" else ""
        fw.set_state("connecting", f"last attempt: {last}" if last else "")
        for lane in self.lanes:
            if not await self._open(lane):
                return
        # The cursors first: where the connector starts is where its first start found the
        # streams, and its lag counts from there, also while its broker does not answer yet.
        if not await self._load():
            return
        await self.sink.connect()
        fw.reached = True
        await self._read_back()
        fw.set_state("streaming")
        next_save = time.monotonic() + SAVE_EVERY
        next_poll = time.monotonic() + POLL
        while not self.stop.is_set():
            fw.kick.clear()
            await self._settle()
            now = time.monotonic()
            if now >= next_poll:  # asks the store: a notification lost is made up for here
                next_poll = now + POLL
                for lane in self.lanes:
                    lane.hungry = lane.ask = True
                    await self._replay(lane)
            if fw.notified:  # a source committed: its lane may have more
                fw.notified = False
                for lane in self.lanes:
                    lane.hungry = True
            for lane in self.lanes:
                await self._fill(lane)
            self._release_retries(now)
            self._dispatch()
            if now >= next_save:
                next_save = now + SAVE_EVERY
                await self._save()
            self.show_in_flight(self.sent)
            wake = min(next_save, next_poll, self.retries[0][0] if self.retries else next_poll)
            if any(lane.hungry for lane in self.lanes) and self.pending < self.cfg.max_pending:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fw.kick.wait(), max(0.0, wake - time.monotonic()))
        await self._drain()

    async def _open(self, lane: Lane) -> bool:
        """Open a lane's reader, which may wait for its fence; False when asked to stop first."""
        opening = asyncio.ensure_future(lane.reader.open())
        stopping = asyncio.ensure_future(self.stop.wait())
        either, first = {opening, stopping}, asyncio.FIRST_COMPLETED
        if not (await asyncio.wait(either, timeout=FENCE_SAID, return_when=first))[0]:
            self.fw.set_state("waiting", "for the session that still sends it to end")
            await asyncio.wait(either, return_when=first)  # weir status says why meanwhile
        stopping.cancel()
        if not opening.done():
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await opening
            return False
        opening.result()  # its error, if it failed
        return True

    async def _load(self) -> bool:
        """Load (or make) the lanes' cursors; False when asked to stop first."""
        for lane in self.lanes:
            # A source a change over the API added starts after the head noted at the change:
            # its first cursor there, and a cursor left from before it was taken out and
            # added again passed over to it.
            added = self.cfg.added_at(lane.reader.sync_id)
            start = self.cfg.start_position if added is None else SeqStart(seq=added + 1)
            while True:
                try:
                    cur = await lane.reader.cursor(start, self.fw.had)
                    break
                except NotNow as e:  # an old split's shard still runs, or its start is to come
                    self.fw.set_state("waiting", str(e))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop.wait(), POLL)
                    if self.stop.is_set():
                        return False
            lane.fetched, lane.mark = max(cur.seq, added or 0), cur.mark
            if not cur.new and "start_position" in self.cfg.model_fields_set and not self.fw.said:
                self.fw.said = True
                log.info("connector %s: going on from its saved position (seq %d of source %s); "
                         "start_position applies to a connector's first start only",
                         self.fw.name, cur.seq, lane.reader.sync_id)  # fmt: skip
        self.fw.had = True
        return True

    async def _read_back(self) -> None:
        """Read back what the broker took after the cursors' marks (the broker connected)."""
        marks = [lane.mark for lane in self.lanes if lane.mark is not None]
        for lane in self.lanes:
            lane.loaded = True  # its cursor may be written from here on, its mark the broker's
            if lane.mark is None:  # where the broker is before anything is sent: the read-back
                # after a crash before the first save starts here
                lane.saved = lane.state(self.mark)
                await lane.reader.save(*lane.saved)
        if not marks or self.readable is None:
            return
        since = earliest(marks)
        keys = await self.readable.read_back(since, [lane.reader.sync_id for lane in self.lanes])
        for lane in self.lanes:
            prefixes = key_prefixes(lane.reader.sync_id)
            lane.skip = {k for k in keys if k.startswith(prefixes)}
            if lane.skip:
                lane.floor = (since, await lane.reader.head())
        if keys:
            log.info("connector %s: the broker already has %d messages sent before the restart;"
                     " they are not sent again", self.fw.name, len(keys))  # fmt: skip

    async def _fill(self, lane: Lane) -> None:
        room = self.cfg.max_pending - self.pending
        if not lane.hungry or room <= 0:
            return
        if lane.fetched >= lane.head:
            heard = self.fw.notifier.heads.get(lane.reader.sync_id)
            if heard is not None:  # a commit said so: no need to ask
                lane.head = max(lane.head, heard[self.stream])
            if lane.fetched >= lane.head and (lane.ask or heard is None):
                lane.head = await lane.reader.head()  # a query a poll, not a notification
            lane.ask = False
            if lane.fetched >= lane.head:
                lane.hungry = False
                return
        upto = min(lane.head, lane.fetched + SPAN)
        limit = min(room, PAGE)
        msgs = await lane.reader.fetch(lane.fetched, upto, limit)
        lane.fetched = msgs[-1].seq if len(msgs) == limit else upto
        skip, admit = lane.skip, self.groups.admit
        for msg in msgs:
            if skip and msg.key in skip:
                skip.discard(msg.key)  # the broker took it before the restart
                continue
            lane.outstanding.append(msg.seq)
            self.pending += 1
            if (older := admit(msg.group, (lane, msg))) is not None:
                self._settled(*older)  # a newer version of the record replaced it

    async def _replay(self, lane: Lane) -> None:
        """Admit the lane's failed messages an operator asked to retry: each goes through its
        group like a message just read, so it never goes out beside another of its group."""
        msgs, replaced = await lane.reader.retries(REPLAYS)
        lane.resolved += [(seq, "") for seq in replaced]  # a newer version went after it
        for msg in msgs:
            if msg.key not in self.replaying:
                self.replaying.add(msg.key)
                if (older := self.groups.admit(msg.group, (lane, msg))) is not None:
                    self._settled(*older)

    def _settled(self, lane: Lane, msg: Message) -> None:
        """``msg`` is done with: the broker took it, or a newer version replaced it."""
        if msg.replay:  # its entry leaves the failed list at the next save; the cursor is past
            lane.resolved.append((msg.seq, msg.key))
            return
        lane.settle(msg.seq)
        self.pending -= 1

    def _release_retries(self, now: float) -> None:
        while self.retries and self.retries[0][0] <= now:
            _, _, lane, msg = heapq.heappop(self.retries)
            self.ready.appendleft((lane, msg))

    def _dispatch(self) -> None:
        if self.ready and any(lane.reader.fence_lost() for lane in self.lanes):
            # Its store session ended (a frozen process whose connections were cut resumes
            # here): another owner may be sending now, so nothing more goes out.
            raise FenceLost(
                said(
                    "connector %s: the store ended its session (and its fence); it "
                    "sends again once it holds the fence anew",
                    self.fw.name,
                )
            )
        batch_cfg = self.cfg.batch
        suspects = self.fw.suspects
        while self.ready and len(self.in_flight) < self.cfg.max_in_flight and not self.probing:
            batch: list[tuple[Lane, Message]] = []
            size = 0
            while self.ready and len(batch) < batch_cfg.max_messages:
                lane, msg = self.ready[0]
                if batch and size + len(msg.payload) > batch_cfg.max_bytes:
                    break
                if suspects and msg.key in suspects:  # a suspect goes alone, nothing beside it
                    if batch or self.in_flight:
                        break
                    self.probing = True
                self.ready.popleft()
                msg.attempts += 1
                size += len(msg.payload)
                batch.append((lane, msg))
                if self.probing:
                    break
            if not batch:
                return
            if self.probing and (charge := self._charged(batch[0][1])) is not None:
                self.probing = False
                self.done.append((batch, BatchError({0: charge})))
                self.fw.kick.set()
                continue
            mark = self.mark()
            top: dict[int, tuple[Lane, int]] = {}
            for lane, msg in batch:
                seen = top.get(id(lane))
                if seen is None or msg.seq > seen[1]:
                    top[id(lane)] = (lane, msg.seq)
            for lane, max_seq in top.values():
                lane.note_dispatch(mark, max_seq)
            self.sent += len(batch)
            write = self.write([m for _, m in batch])
            self.in_flight.add(task := asyncio.create_task(write))  # keeps the task alive
            task.add_done_callback(functools.partial(self._finished, batch=batch))

    def mark(self) -> BrokerMark:
        """Where the broker is now: a readable one's mark, {} for one that cannot be read."""
        return self.readable.mark() if self.readable is not None else {}

    def _charged(self, msg: Message) -> FatalError | None:
        return self.fw.suspects.charged(msg.key, self.cfg.retry.max_attempts)

    def _finished(self, task: asyncio.Task[None], *, batch: list[tuple[Lane, Message]]) -> None:
        self.in_flight.discard(task)
        if task.cancelled():
            return
        self.done.append((batch, task.exception()))
        self.sent -= len(batch)
        self.fw.kick.set()

    async def _settle(self) -> None:
        """Account for finished batches: acks settle, failures back off or go to the list."""
        suspects, release = self.fw.suspects, self.groups.release
        while self.done:
            batch, exc = self.done.popleft()
            self.probing = False
            failed: dict[int, BaseException] = {}
            if isinstance(exc, BatchError):
                failed = dict(exc.failed)
            elif exc is not None:  # the connection is in doubt: a new session reads back
                suspects.lost_connection([m for _, m in batch], exc)
                raise exc
            committed = []
            retried: BaseException | None = None
            for i, (lane, msg) in enumerate(batch):
                err = failed.get(i)
                if suspects:
                    suspects.pop(msg.key, None)  # the broker answered for it
                if err is None:
                    committed.append(msg.committed)
                    self._settled(lane, msg)
                    release(msg.group)
                elif await self._failed(lane, msg, err):
                    retried = err
            self.delivered += len(committed)
            self.fw.metrics.delivered_batch(self.fw.name, committed)
            if retried is not None and not self.failing:
                self.failing = True
                self.fw.set_state("retrying", f"{type(retried).__name__}: {retried}")
            elif retried is None and self.failing:
                self.failing = False
                self.fw.set_state("streaming", "messages go out again")

    async def _failed(self, lane: Lane, msg: Message, err: BaseException) -> bool:
        """A message the broker did not take: retried later (True), or, at its last attempt
        or when it never fits, moved to the failed list (False)."""
        retry = self.cfg.retry
        fatal = isinstance(err, FatalError)
        if fatal or (retry.max_attempts is not None and msg.attempts >= retry.max_attempts):
            reason = f"{type(err).__name__}: {err}"
            await lane.reader.fail(msg, reason)  # a retried one's entry: its new error
            log.warning("connector %s: seq %d (%s) moved to the failed list after %d attempts: %s",
                        self.fw.name, msg.seq, msg.key, msg.attempts, reason)  # fmt: skip
            if msg.replay:
                self.replaying.discard(msg.key)
            else:
                self._settled(lane, msg)
            self.groups.release(msg.group)
            self.count_failed()
            return False
        self.count_retried()
        due = time.monotonic() + retry.delay(msg.attempts, random.random())
        heapq.heappush(self.retries, (due, next(self.tick), lane, msg))
        return True

    async def _save(self) -> None:
        for lane in self.lanes:
            if lane.resolved:  # off the list, then no longer out: never taken twice
                await lane.reader.resolve([seq for seq, _ in lane.resolved])
                self.replaying.difference_update(key for _, key in lane.resolved)
                lane.resolved = []
            if not lane.loaded:
                continue
            state = lane.state(self.mark)
            if state != lane.saved:
                await lane.reader.save(*state)
                lane.saved = state

    async def _drain(self) -> None:
        """Stop reading, let the batches out finish (within the broker's ack timeout), save."""
        self.fw.set_state("draining")
        if self.in_flight:  # each ends within the sink's ack timeout; weir run bounds the rest
            await asyncio.wait(set(self.in_flight))
        await self._settle()
        await self._save()
        self.fw.set_state("stopped")
