"""The NATS JetStream sink: pipelined publishes, each with ``Nats-Msg-Id`` and a PubAck.

Publishes go out on one connection with a reply subject each (as nats-py's ``publish_async``
does, but without its leaked-future path when a publish fails mid-batch); the acks tell the
stream sequences that make up :meth:`NatsSink.mark`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Sequence

import nats
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from connectors.nats.config import NatsConnector
from connectors.nats.connection import connect
from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import BrokerMark, Message, event_subject, record_subject, subject_prefix

log = logging.getLogger("weir.nats")

MSG_TOO_LARGE = 10054  # JetStream: message size exceeds maximum allowed
MAX_CONTROL_LINE = 4096  # nats-server's default max_control_line (its INFO does not say)
HEADERS = len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n")  # the header block, but the id
# nats-py hands the server's -ERR over in lower case, subject included.
_DENIED = re.compile(r'permissions violation for publish to "?([^"\s]+)', re.IGNORECASE)


class NatsSink:
    """One connector's JetStream connection (see core/engine/sink.py for the contract)."""

    def __init__(self, cfg: NatsConnector) -> None:
        self.cfg = cfg
        self.settings = cfg.nats
        self.records = cfg.stream == "records"
        self._nc: Client | None = None
        self._inbox = ""
        self._acks: dict[str, tuple[asyncio.Future[tuple[str, int]], str]] = {}  # and subject
        self._ids = itertools.count()
        self._mark: BrokerMark = {}
        self._closing = False
        # JetStream deduplicates per stream, and connectors of other namespaces may publish the
        # same change into one stream (DESIGN.md section 5): the namespace is part of the id.
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

        async def on_disconnect() -> None:
            if self._closing:
                return
            log.warning("connector %s: nats connection lost", self.cfg.name)
            lost = ConnectionError("the NATS connection was lost")
            for fut, _ in self._acks.values():  # no ack comes on a new connection
                if not fut.done():
                    fut.set_exception(lost)

        self._nc = await connect(self.cfg, error_cb=on_error, disconnected_cb=on_disconnect)
        self._inbox = self.nc.new_inbox() + "."
        await self.nc.subscribe(self._inbox + "*", cb=self._on_ack, pending_msgs_limit=-1)
        for info in await self.nc.jetstream().streams_info():
            self._mark[info.config.name or ""] = info.state.last_seq

    def _refuse(self, subject: str, reason: str) -> None:
        subject = subject.lower()
        for token, (fut, subj) in list(self._acks.items()):
            if subj.lower() == subject and not fut.done():
                del self._acks[token]
                fut.set_exception(FatalError(reason))

    async def _on_ack(self, msg: Msg) -> None:
        fut, _ = self._acks.pop(msg.subject[len(self._inbox) :], (None, ""))
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            fut.set_exception(RetryableError("no JetStream stream takes this subject"))
            return
        resp = orjson.loads(msg.data)
        error = resp.get("error")
        if error is not None:
            code, err_code = error.get("code"), error.get("err_code")
            text = f"JetStream {code}/{err_code}: {error.get('description')}"
            too_large = err_code == MSG_TOO_LARGE
            fut.set_exception(FatalError(text) if too_large else RetryableError(text))
            return
        fut.set_result((resp["stream"], resp["seq"]))

    def subject(self, m: Message) -> str:
        ns = self.settings.namespace
        if self.records:
            return record_subject(ns, m.group)
        return event_subject(ns, m.group, m.action or "")

    async def write_batch(self, batch: Sequence[Message]) -> None:
        nc = self.nc
        loop = asyncio.get_running_loop()
        limit = nc.max_payload
        futs: list[asyncio.Future[tuple[str, int]] | None] = []
        tokens: list[str] = []
        failed: dict[int, Exception] = {}
        publish = nc.publish
        for i, m in enumerate(batch):
            subject, msg_id = self.subject(m), self._msg_id + m.key
            refusal = self._refusal(subject, msg_id, m.payload, limit)
            if refusal is not None:
                failed[i] = refusal
                futs.append(None)
                continue
            token = str(next(self._ids))
            fut: asyncio.Future[tuple[str, int]] = loop.create_future()
            self._acks[token] = (fut, subject)
            tokens.append(token)
            futs.append(fut)
            try:
                await publish(subject, m.payload, reply=self._inbox + token,
                              headers={"Nats-Msg-Id": msg_id})  # fmt: skip
            except Exception:
                self._forget(tokens)
                raise  # connection closed, or its buffer full while reconnecting
        waiting = [f for f in futs if f is not None]
        timeout = self.settings.ack_timeout.total_seconds()
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=timeout)
            if late:
                self._forget(tokens)
                raise ConnectionError(f"{len(late)} PubAcks overdue after {timeout}s")
        mark = self._mark
        for i, f in enumerate(futs):
            if f is None:
                continue
            if isinstance(exc := f.exception(), ConnectionError):
                self._forget(tokens)
                for other in futs:  # their errors are this one: seen
                    if other is not None and other.done():
                        other.exception()
                raise exc  # in doubt: the engine starts over and reads back what was taken
            if exc is not None:
                failed[i] = exc if isinstance(exc, Exception) else RetryableError(repr(exc))
            else:
                stream, seq = f.result()
                if seq > mark.get(stream, 0):
                    mark[stream] = seq
        if failed:
            raise BatchError(failed)

    def _refusal(self, subject: str, msg_id: str, payload: bytes, limit: int) -> FatalError | None:
        """Why the server would refuse this message (and close the connection for it), with
        its subject and headers counted; None when it fits."""
        size = len(payload) + HEADERS + len(msg_id)
        if size > limit:
            return FatalError(
                f"message of {size} bytes with its headers is over the server's max_payload "
                f"({limit})"
            )
        if len(subject) + len(self._inbox) + 48 > MAX_CONTROL_LINE:
            return FatalError(
                f"subject of {len(subject)} bytes is too long for the server's control line "
                f"({MAX_CONTROL_LINE} bytes): {subject[:80]}..."
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
        stream whose sequence fell below the mark was made anew: it is read from its start."""
        js = self.nc.jetstream()
        keys: set[str] = set()
        prefix = subject_prefix(self.cfg.stream, self.settings.namespace)
        for info in await js.streams_info():
            name = info.config.name or ""
            filters = {f for sync_id in sync_ids for taken in info.config.subjects or []
                       if (f := intersect(f"{prefix}.{sync_id}.>", taken))}  # fmt: skip
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
