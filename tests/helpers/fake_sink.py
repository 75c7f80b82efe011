"""An in-memory broker and its sink, for unit tests of the forwarding engine only (the project
allows fakes in unit tests, never in integration tests).

Modelled on faststream's ``TestNatsBroker``/``FakeProducer``: the engine keeps its real code path
and only the producer is swapped for one that stores in memory. :class:`FakeBroker` is the
broker, which outlives connections as a real one outlives Weir's sessions; :class:`FakeSink`
is one session's connection to it and implements core/engine/sink.py's ``Sink`` and
``ReadBack`` as the real connectors do (connectors/nats/sink.py): stream sequences per broker
stream, a ``mark`` that only grows with acknowledgements, and a ``read_back`` of the keys stored
after a mark; :class:`BlindSink` is one without ``ReadBack``.

The broker has no duplicate window (like Kafka): a message sent twice is stored twice, so a
test sees every resend the engine makes. Faults are scripted on the broker:
:meth:`FakeBroker.fail` (one message, by key), :meth:`FakeBroker.fail_batch` (indexes of the
next batch, or all of it), :meth:`FakeBroker.drop_connection` and :meth:`FakeBroker.hold`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import BrokerMark, Message


class Stored(NamedTuple):
    """One message as the broker stored it."""

    stream: str  # the broker stream (or partition) it went to
    position: int  # its sequence in that stream, from 1
    sync_id: str
    seq: int  # its seq in Weir's store
    group: str
    key: str
    payload: bytes


class Drop(NamedTuple):
    """A scripted connection loss: the first ``stored`` messages of the batch are stored,
    then the connection is gone and no ack comes for any of them."""

    stored: int


class FakeBroker:
    """The broker a test inspects: ``stored`` in arrival order, ``writes`` the keys of each
    ``write_batch`` call. ``route`` names the stream a message goes to (one stream by default);
    a stream exists from its first message on, as a Kafka topic made for a new table does, so
    marks taken earlier lack it.
    """

    def __init__(self, route: Callable[[Message], str] = lambda m: "main") -> None:
        self.route = route
        self.stored: list[Stored] = []
        self.last: dict[str, int] = {}  # each stream's last position
        self.writes: list[list[str]] = []
        self.connects = 0
        self.refusals: dict[int, BaseException] = {}  # the connects (1: the first) that raise
        self._faults: dict[str, deque[BaseException]] = {}  # by key: one per coming write
        self._always: dict[str, BaseException] = {}  # by key: every write
        self._next_batches: deque[dict[int, Exception] | Drop | None] = deque()
        self._holds: dict[str, asyncio.Event] = {}

    def sink(self, connector: Any = None) -> FakeSink:
        """A new connection; pass ``broker.sink`` as the engine's ``open_sink``."""
        return FakeSink(self)

    def blind_sink(self, connector: Any = None) -> BlindSink:
        """A new connection that cannot read the broker back, as a webhook's or SQS's."""
        return BlindSink(FakeSink(self))

    # Scripted faults ------------------------------------------------------------------------

    def fail(self, key: str, error: BaseException, times: int | None = 1) -> None:
        """The next ``times`` writes of the message ``key`` (every one when None) fail with
        ``error``: a RetryableError or FatalError is answered for it alone (the rest of its
        batch is stored); any other exception stores the messages before it and then drops the
        connection, as a broker that closes the connection because of one message does."""
        if times is None:
            self._always[key] = error
        else:
            self._faults.setdefault(key, deque()).extend([error] * times)

    def fail_batch(self, failed: dict[int, Exception] | None = None) -> None:
        """The next write answers ``BatchError(failed)``: the messages at those indexes fail
        and the others are stored; None fails every message of it retryably."""
        self._next_batches.append(failed)

    def drop_connection(self, stored: int = 0) -> None:
        """The next write stores its first ``stored`` messages, then loses the connection."""
        self._next_batches.append(Drop(stored))

    def hold(self, key: str) -> asyncio.Event:
        """The batch holding ``key`` waits for the returned event before the broker answers."""
        self._holds[key] = event = asyncio.Event()
        return event

    # What the broker holds ------------------------------------------------------------------

    def stored_keys(self) -> list[str]:
        """The idempotency keys of the stored messages, in arrival order."""
        return [s.key for s in self.stored]

    def by_group(self) -> dict[str, list[int]]:
        """Each group's stored seqs, in arrival order."""
        groups: dict[str, list[int]] = {}
        for s in self.stored:
            groups.setdefault(s.group, []).append(s.seq)
        return groups

    def _store(self, m: Message) -> tuple[str, int]:
        stream = self.route(m)
        position = self.last[stream] = self.last.get(stream, 0) + 1
        self.stored.append(Stored(stream, position, m.sync_id, m.seq, m.group, m.key, m.payload))
        return stream, position

    def _fault(self, key: str) -> BaseException | None:
        queue = self._faults.get(key)
        if queue:
            return queue.popleft()
        return self._always.get(key)

    async def _write(
        self, batch: Sequence[Message]
    ) -> tuple[list[tuple[str, int]], dict[int, Exception]]:
        """Store a batch as the script says: the stream and position of each message stored,
        and the failures of the others by index. Raises when the script drops the connection."""
        self.writes.append([m.key for m in batch])
        for key in [m.key for m in batch if m.key in self._holds]:
            await self._holds.pop(key).wait()
        script = self._next_batches.popleft() if self._next_batches else {}
        if isinstance(script, Drop):
            for m in batch[: script.stored]:
                self._store(m)
            raise ConnectionError("the fake broker dropped the connection")
        if script is None:
            script = {
                i: RetryableError("the fake broker takes nothing now") for i in range(len(batch))
            }
        failed = dict(script)
        acks = []
        for i, m in enumerate(batch):
            fault = failed.get(i) or self._fault(m.key)
            if fault is None:
                acks.append(self._store(m))
            elif isinstance(fault, (RetryableError, FatalError)):
                failed[i] = fault
            else:
                raise fault  # the messages before it are stored, without acks
        return acks, failed


class FakeSink:
    """One connection to a :class:`FakeBroker`, implementing the engine's ``Sink`` contract.

    Like a real connector it does nothing in its constructor, raises when used before
    ``connect()`` or after ``close()``, and is dead after it lost its connection.
    """

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.connected = False
        self.lost = False
        self._mark: BrokerMark = {}

    async def connect(self) -> None:
        """Called once, first, by each engine session: takes the broker's current positions
        as the mark, as the NATS sink reads its streams' last sequences."""
        self.broker.connects += 1
        if refusal := self.broker.refusals.get(self.broker.connects):
            raise refusal
        self._mark = dict(self.broker.last)
        self.connected = True

    def _check(self) -> None:
        if not self.connected:
            raise RuntimeError("FakeSink used before connect() or after close()")
        if self.lost:
            raise ConnectionError("the fake broker's connection is lost")

    async def write_batch(self, batch: Sequence[Message]) -> None:
        """Called with each batch, several at once (up to ``max_in_flight``): returns when the
        broker stored every message; raises BatchError naming the ones it did not, or
        ConnectionError when the connection is lost (then nothing of the batch is acked)."""
        self._check()
        try:
            acks, failed = await self.broker._write(batch)
        except BaseException:
            self.lost = True
            raise
        mark = self._mark
        for stream, position in acks:
            if position > mark.get(stream, 0):
                mark[stream] = position
        if failed:
            raise BatchError(failed)

    def mark(self) -> BrokerMark:
        """Called before each batch goes out and when the cursor is saved: each stream's
        last position acknowledged on this connection (or seen at connect)."""
        return dict(self._mark)

    async def read_back(self, mark: BrokerMark, sync_ids: Sequence[str]) -> set[str]:
        """Called once per session after connect(), with the earliest saved mark: the keys
        of these sources' messages stored after ``mark`` (a stream it lacks from its start)."""
        self._check()
        wanted = set(sync_ids)
        return {
            s.key
            for s in self.broker.stored
            if s.sync_id in wanted and s.position > mark.get(s.stream, 0)
        }

    async def close(self) -> None:
        """Called last by each session, also after a failure; the sink is not used again."""
        self.connected = False


class BlindSink:
    """A connection to a :class:`FakeBroker` whose broker cannot be read (core/engine/sink.py's
    ``Sink`` without ``ReadBack``), as a webhook receiver or an SQS queue."""

    def __init__(self, sink: FakeSink) -> None:
        self.connect, self.write_batch, self.close = sink.connect, sink.write_batch, sink.close
