"""The NATS JetStream sink: pipelined publishes, each with ``Nats-Msg-Id``.

Where the stream that takes all of the connector's subjects allows fast batches (nats-server
2.14 on, ``allow_batched``, as ``weir nats setup`` makes it), a batch is published as one
(connectors/nats/fast.py), answered once. Otherwise each message has a reply subject of its
own, and its PubAck fills its place in the batch's results; the last one wakes the batch (a
future a batch, not one a message: on this machine nats-py's publish and a future a message
cost more than the rest of a connector together). Either way a batch's frames go out on one
connection as one write of HPUB frames, handed to nats-py's pending buffer
(``Client._send_command``) as its own ``publish`` does, so they keep their order with its other
commands and wait in it across a reconnect; the acks tell the stream sequences that make up
:meth:`NatsSink.mark`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import nats
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from connectors.nats.config import NatsConnector
from connectors.nats.connection import connect
from connectors.nats.fast import (
    HEADERS,
    NO_RESPONDERS,
    FastBatches,
    Result,
    Unbatched,
    error_of,
    frame,
)
from core.config.steps import RouteStep
from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import BrokerMark, Message, event_subject, record_subject, subject_prefix
from core.redact import said

log = logging.getLogger("weir.nats")

MAX_CONTROL_LINE = 4096  # nats-server's default max_control_line (its INFO does not say)
# nats-py hands the server's -ERR over in lower case, subject included.
_DENIED = re.compile(r'permissions violation for publish to "?([^"\s]+)', re.IGNORECASE)
# publishes messages (subjects, payloads, keys) and gives each's result, in order
Publish = Callable[[Sequence[str], Sequence[bytes], Sequence[str]], Awaitable[list[Result]]]


@dataclass(eq=False, slots=True)
class _Batch:
    """A batch's publishes waiting for their PubAcks: each fills its place in ``results``."""

    done: asyncio.Future[None]
    subjects: list[str]
    results: list[tuple[str, int] | Exception | None]
    left: int = 0

    def settle(self, i: int, result: tuple[str, int] | Exception) -> None:
        if self.results[i] is None:
            self.results[i] = result
            self.left -= 1
            if self.left == 0 and not self.done.done():
                self.done.set_result(None)


class NatsSink:
    """One connector's JetStream connection (see core/engine/sink.py for the contract)."""

    def __init__(self, cfg: NatsConnector) -> None:
        self.cfg = cfg
        self.settings = cfg.nats
        self.records = cfg.stream == "records"
        self._nc: Client | None = None
        self._inbox = ""
        self._acks: dict[str, tuple[_Batch, int]] = {}  # by reply token: its batch and place
        self._ids = itertools.count()
        self._mark: BrokerMark = {}
        self._closing = False
        self._fast: FastBatches | None = None  # when the stream takes fast batches
        # JetStream deduplicates per stream, and connectors of other namespaces may publish the
        # same change into one stream (docs/design.md “Guarantees”): the namespace is
        # part of the id.
        self._msg_id = f"{self.settings.namespace}:"

    @property
    def nc(self) -> Client:
        if self._nc is None:
            raise RuntimeError("NatsSink used before connect()")
        return self._nc

    async def connect(self) -> None:
        async def on_error(e: Exception) -> None:
            log.debug("connector %s: nats: %s", self.cfg.name, e)
            if denied := _DENIED.search(str(e)):  # the server refused a subject: no ack comes
                self._refuse(denied.group(1), f"NATS refused the subject: {e}")
                if self._fast is not None:
                    self._fast.refuse(denied.group(1), f"NATS refused the subject: {e}")

        async def on_disconnect() -> None:
            if self._closing:
                return
            log.warning("connector %s: nats connection lost", self.cfg.name)
            lost = ConnectionError("the NATS connection was lost")
            for batch, _ in self._acks.values():  # no ack comes on a new connection
                if not batch.done.done():
                    batch.done.set_exception(lost)
            if self._fast is not None:
                self._fast.lost(lost)

        self._nc = nc = await connect(self.cfg, error_cb=on_error, disconnected_cb=on_disconnect)
        self._inbox = nc.new_inbox() + "."
        acks = await nc.subscribe(self._inbox + "*", cb=self._on_ack, pending_msgs_limit=-1)
        # Acks are taken as nats-py's parser reads them, not as a Msg through the
        # subscription's queue and task (each of those a message cost more than the ack).
        deliver, sid, skip = nc._process_msg, acks._id, len(self._inbox)
        fast, fast_sid, fast_skip = None, -1, 0
        if await self._batched_stream():
            log.info("connector %s: publishes fast batches (the stream allows them)", self.cfg.name)
            inbox = nc.new_inbox() + "."
            fast = self._fast = FastBatches(self._publish, inbox, self._msg_id,
                                            self.settings.ack_timeout.total_seconds())  # fmt: skip
            fast_sid = (await nc.subscribe(inbox + ">", pending_msgs_limit=-1))._id
            fast_skip = len(inbox)

        async def process(sid_: int, subject: bytes, reply: bytes, data: bytes, hdr: bytes) -> None:
            if sid_ == sid:
                self._ack(subject[skip:].decode(), data, hdr)
            elif sid_ == fast_sid and fast is not None:
                fast.reply(subject[fast_skip:].decode(), data, hdr)
            else:
                await deliver(sid_, subject, reply, data, hdr)

        nc._process_msg = process  # type: ignore[method-assign, assignment]

    async def _batched_stream(self) -> bool:
        """Notes each stream's last sequence (``mark``); whether the stream that takes all of
        this connector's subjects takes fast batches (connectors/nats/fast.py)."""
        ours = subject_prefix(self.cfg.stream, self.settings.namespace) + ".>"
        batched = False
        for info in await self.nc.jetstream().streams_info():
            self._mark[info.config.name or ""] = info.state.last_seq
            if info.config.allow_batched and any(
                intersect(ours, taken) == ours for taken in info.config.subjects or []
            ):
                batched = True
        return batched

    async def _publish(self, frames: bytes) -> None:
        await self.nc._send_command(frames)
        await self.nc._flush_pending()

    def _refuse(self, subject: str, reason: str) -> None:
        subject = subject.lower()
        for token, (batch, i) in list(self._acks.items()):
            if batch.subjects[i].lower() == subject:
                del self._acks[token]
                batch.settle(i, FatalError(reason))

    async def _on_ack(self, msg: Msg) -> None:
        """An ack that came the way of any message (none does while ``_ack`` takes them)."""
        status = msg.headers.get("Status") if msg.headers else None
        self._ack(
            msg.subject[len(self._inbox) :], msg.data, NO_RESPONDERS if status == "503" else None
        )

    def _ack(self, token: str, data: bytes, hdr: bytes | None) -> None:
        """A PubAck (``hdr``: its header block, a status when the server answered one)."""
        got = self._acks.pop(token, None)
        if got is None:
            return
        batch, i = got
        if hdr and hdr.startswith(NO_RESPONDERS):
            batch.settle(i, RetryableError("no JetStream stream takes this subject"))
            return
        resp = orjson.loads(data)
        error = resp.get("error")
        batch.settle(i, error_of(error) if error is not None else (resp["stream"], resp["seq"]))

    def subject(self, m: Message) -> str:
        ns = self.settings.namespace
        if m.route is not None and "subject" in m.route:  # its steps' route
            return f"{subject_prefix(self.cfg.stream, ns)}.{m.route['subject']}"
        if self.records:
            return record_subject(ns, m.group)
        return event_subject(ns, m.group, m.action or "")

    async def write_batch(self, batch: Sequence[Message]) -> None:
        if self.nc.is_closed:
            raise ConnectionError("the NATS connection is closed")
        limit = self.nc.max_payload
        results: list[Result | None] = [None] * len(batch)
        subjects = [self.subject(m) for m in batch]
        go: list[int] = []
        for i, m in enumerate(batch):
            results[i] = refusal = self._refusal(subjects[i], m.key, m.payload, limit)
            if refusal is None:
                go.append(i)
        if go and self._fast is not None:
            await self._send(self._fast.publish, go, subjects, batch, results)
            unbatched = [r for r in results if isinstance(r, Unbatched)]  # these go singly
            go = [i for i in go if isinstance(results[i], Unbatched)]
            if any(r.off for r in unbatched):
                log.warning("connector %s: the stream no longer allows fast batches: publishing "
                            "a message at a time", self.cfg.name)  # fmt: skip
                self._fast = None
        if go:
            await self._send(self._singly, go, subjects, batch, results)
        mark = self._mark
        failed: dict[int, Exception] = {}
        for i, result in enumerate(results):
            if isinstance(result, Exception):
                failed[i] = result
            elif result is not None:
                stream, seq = result
                if seq > mark.get(stream, 0):
                    mark[stream] = seq
        if failed:
            raise BatchError(failed)

    @staticmethod
    async def _send(
        send: Publish,
        go: list[int],
        subjects: list[str],
        batch: Sequence[Message],
        results: list[Result | None],
    ) -> None:
        """Publish the messages ``go`` of ``batch`` by ``send``, putting each's outcome in
        ``results``."""
        got = await send([subjects[i] for i in go], [batch[i].payload for i in go],
                         [batch[i].key for i in go])  # fmt: skip
        for i, sent in zip(go, got, strict=True):
            results[i] = sent

    async def _singly(
        self, subjects: Sequence[str], payloads: Sequence[bytes], keys: Sequence[str]
    ) -> list[Result]:
        """Each message published on its own, with a PubAck of its own."""
        n = len(subjects)
        state = _Batch(asyncio.get_running_loop().create_future(), list(subjects), [None] * n, n)
        tokens = [str(next(self._ids)) for _ in range(n)]
        inbox = self._inbox.encode()
        for i, token in enumerate(tokens):
            self._acks[token] = (state, i)
        frames = [frame(subjects[i].encode(), inbox + tokens[i].encode(),
                        (self._msg_id + keys[i]).encode(), payloads[i])
                  for i in range(n)]  # fmt: skip
        await self._publish(b"".join(frames))
        timeout = self.settings.ack_timeout.total_seconds()
        try:
            await asyncio.wait_for(asyncio.shield(state.done), timeout)
        except TimeoutError:
            self._forget(tokens)
            raise ConnectionError(
                said("%s PubAcks overdue after %ss", state.left, timeout)
            ) from None
        except ConnectionError:
            self._forget(tokens)
            raise  # in doubt: the engine starts over and reads back what was taken
        return [r if r is not None else RetryableError("no PubAck") for r in state.results]

    def _refusal(self, subject: str, key: str, payload: bytes, limit: int) -> FatalError | None:
        """Why the server would refuse this message (and close the connection for it), with
        its subject and headers counted; None when it fits."""
        size = len(payload) + HEADERS + len(self._msg_id) + len(key)
        if size > limit:
            return FatalError(
                said(
                    "message of %s bytes with its headers is over the server's max_payload (%s)",
                    size,
                    limit,
                )
            )
        if len(subject) + len(self._inbox) + 96 > MAX_CONTROL_LINE:  # a fast batch's reply too
            return FatalError(
                said(
                    "subject of %s bytes is too long for the server's control line "
                    "(%s bytes): %s...",
                    len(subject),
                    MAX_CONTROL_LINE,
                    subject[:80],
                )
            )
        return None

    def _forget(self, tokens: list[str]) -> None:
        """Stop waiting for the acks of an abandoned batch."""
        for token in tokens:
            self._acks.pop(token, None)

    def mark(self) -> BrokerMark:
        return dict(self._mark)

    async def read_back(self, mark: BrokerMark, sync_ids: Sequence[str]) -> set[str]:
        """Msg ids stored after ``mark`` in every stream that takes some of this connector's
        subjects (one stream for all, or one a table: whatever subjects they were given). A
        stream whose sequence fell below the mark was made anew: it is read from its start.
        Routed by its steps, its subjects are any under its prefix: all of them are read."""
        js = self.nc.jetstream()
        keys: set[str] = set()
        prefix = subject_prefix(self.cfg.stream, self.settings.namespace)
        routed = any(isinstance(s, RouteStep) for s in self.cfg.steps)
        ours = [f"{prefix}.>"] if routed else [f"{prefix}.{sync_id}.>" for sync_id in sync_ids]
        for info in await js.streams_info():
            name = info.config.name or ""
            filters = {f for pattern in ours for taken in info.config.subjects or []
                       if (f := intersect(pattern, taken))}  # fmt: skip
            last = info.state.last_seq
            start = mark.get(name, 0) + 1
            if last < start - 1:  # made anew since the mark
                start = info.state.first_seq
            if not filters or last < start:
                continue
            for filter_subject in sorted(filters):
                await self._read_ids(name, filter_subject, start, last, keys)
        return keys

    async def _read_ids(
        self, stream: str, filter_subject: str, start: int, last: int, keys: set[str]
    ) -> None:
        js = self.nc.jetstream()
        sub = await js.subscribe(
            filter_subject,
            stream=stream,
            ordered_consumer=True,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start,
                headers_only=True,
            ),
        )  # fmt: skip
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=2.0)
                except nats.errors.TimeoutError:
                    return  # nothing (more) matches the filter
                key = msg.headers.get("Nats-Msg-Id", "") if msg.headers else ""
                if key.startswith(self._msg_id):
                    keys.add(key[len(self._msg_id) :])
                meta = msg.metadata
                if meta.num_pending == 0 or meta.sequence.stream >= last:
                    return
        finally:
            await sub.unsubscribe()

    async def close(self) -> None:
        self._closing = True
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()  # the engine has awaited every batch it still cares for


def make_sink(cfg: NatsConnector) -> NatsSink:
    return NatsSink(cfg)


def intersect(a: str, b: str) -> str | None:
    """The subjects two NATS subject patterns (``*`` one token, ``>`` the rest) both match, as
    one pattern; None when they share none."""
    x, y = a.split("."), b.split(".")
    out: list[str] = []
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if p == ">":
            return ".".join(out + y[i:])
        if q == ">":
            return ".".join(out + x[i:])
        if p != q and "*" not in (p, q):
            return None
        out.append(q if p == "*" else p)
    return ".".join(out) if len(x) == len(y) else None
