"""JetStream fast batch publishing (nats-server 2.14 on, a stream with ``allow_batched``): one
answer a batch, where a PubAck a message cost the connector a quarter of its CPU.

A batch's messages keep their ``Nats-Msg-Id`` (the stream's duplicate window drops one sent
again after a crash, as for single publishes); the batch is told in each reply subject,
``<inbox>.<batch id>.<flow>.fail.<n>.<op>.$FI`` (ADR-50): ``n`` its place in the batch, ``op`` 0
starts it (answered before the rest go), 1 adds a message, 2 adds the last and commits. (The
commit without a message of its own, op 3, is published too: core NATS subscribers of the
subject received it, an empty message.) The server stores each message as it comes; ``fail``
makes the first message it refuses end the batch (those after it are not stored), and the
batch's one PubAck ``count``s the messages before it, which the stream holds (stored now, or
before: a duplicate). Why it refused that one comes on its own reply subject (an error PubAck,
a 503 when no stream takes its subject) or as the connection's ``-ERR`` (a permission), which
``denied`` collects; when it is the last, no PubAck follows, and that answer ends the batch.
The rest go again at once, as a batch of their own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import orjson

from core.engine.sink import FatalError, RetryableError
from core.redact import said

MSG_TOO_LARGE = 10054  # JetStream: message size exceeds maximum allowed
NO_RESPONDERS = b"NATS/1.0 503"  # the server's answer when no stream takes the subject
_HPUB = b"HPUB %b %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\n\r\n%b\r\n"
HEADERS = len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n")  # the header block, but the id
START, ADD, COMMIT = 0, 1, 2  # ops: the first message, one more, the last
GONE = 10208  # JetStream: the batch is unknown (it ended at a refused message before)
FLOW = 500  # messages between the server's flow acks (which nothing here waits for)

UNBATCHED = (10205, 10211)  # JetStream: fast batches not allowed (any more), too many open
Result = tuple[str, int] | Exception  # (stream, seq: 0 but for the last stored) or why not


class Unbatched(RetryableError):
    """The stream takes no fast batch now (``off``: allow_batched turned off; else too many
    open on it): the message goes again at once, published singly."""

    def __init__(self, text: str, off: bool) -> None:
        super().__init__(text)
        self.off = off


T = TypeVar("T")


@dataclass(eq=False)
class _Round:
    """One fast batch on the wire: its first message's answer, then its PubAck."""

    subjects: Sequence[str]
    started: asyncio.Future[None]
    done: asyncio.Future[tuple[str, int, int]]  # stream, last seq stored, count
    why: dict[int, Exception] = field(default_factory=dict)  # by place in the batch (1-based)


class FastBatches:
    """Publishes batches of one connector as fast batches, on the inbox its sink reads for it
    (``reply`` takes what comes there)."""

    def __init__(self, send: Callable[[bytes], Awaitable[None]], inbox: str, msg_id: str,
                 timeout: float) -> None:  # fmt: skip
        self._send, self._inbox, self._msg_id, self._timeout = send, inbox, msg_id, timeout
        self._rounds: dict[str, _Round] = {}
        self._ids = itertools.count()
        self._base = os.urandom(6).hex()  # batch ids of other connections stay apart
        self.denied: dict[str, str] = {}  # why the server refused a subject (-ERR), by subject

    def refuse(self, subject: str, reason: str) -> None:
        """The server refused a subject (a permission): the batch that sent it ends there, and
        no answer comes to a batch it was the first message of."""
        subject = subject.lower()
        if len(self.denied) > 10_000:  # never looked for: a batch that ended otherwise
            self.denied.clear()
        self.denied[subject] = reason
        for r in self._rounds.values():
            n = len(r.subjects)
            if r.subjects[0].lower() == subject and not r.started.done():
                r.why.setdefault(1, FatalError(reason))
                r.started.set_result(None)
                if n == 1:
                    self._ended(r, FatalError(reason))
            elif n > 1 and r.subjects[-1].lower() == subject and r.started.done():
                self._ended(r, FatalError(reason))

    async def publish(
        self, subjects: Sequence[str], payloads: Sequence[bytes], keys: Sequence[str]
    ) -> list[Result]:
        """Each message's result, in order; batches as many as it takes."""
        results: list[Result] = []
        while len(results) < len(subjects):
            at = len(results)
            results += await self._round(subjects[at:], payloads[at:], keys[at:])
            if isinstance(results[-1], Unbatched):  # the rest go singly too
                results += [results[-1]] * (len(subjects) - len(results))
        return results

    async def _round(
        self, subjects: Sequence[str], payloads: Sequence[bytes], keys: Sequence[str]
    ) -> list[Result]:
        """One fast batch: how many the stream holds, then why the next was refused."""
        loop = asyncio.get_running_loop()
        batch_id = f"{self._base}{next(self._ids)}"
        n = len(subjects)
        r = self._rounds[batch_id] = _Round(subjects, loop.create_future(), loop.create_future())
        prefix = f"{self._inbox}{batch_id}.{FLOW}.fail.".encode()
        ops = [START] + [ADD] * (n - 2) + [COMMIT] if n > 1 else [COMMIT]
        frames = [self._frame(prefix, i + 1, op, subjects[i], payloads[i], keys[i])
                  for i, op in enumerate(ops)]  # fmt: skip
        try:
            if n > 1:  # the first is answered before the rest go
                await self._send(frames[0])
                await self._wait(asyncio.shield(r.started))
            if not r.why:
                await self._send(b"".join(frames[1:] if n > 1 else frames))
                stream, seq, count = await self._wait(asyncio.shield(r.done))
            else:
                stream, seq, count = "", 0, 0
        finally:
            del self._rounds[batch_id]
        held: list[Result] = [(stream, 0)] * count
        if held:
            held[-1] = (stream, seq)
        if count == len(subjects):
            return held
        denied = self.denied.pop(subjects[count].lower(), None)
        why = r.why.get(count + 1) or (
            FatalError(denied) if denied is not None
            else RetryableError("JetStream refused the message and said not why")
        )  # fmt: skip
        return [*held, why]

    def _frame(self, prefix: bytes, n: int, op: int, subject: str, payload: bytes,
               key: str) -> bytes:  # fmt: skip
        reply = prefix + b"%d.%d.$FI" % (n, op)
        return frame(subject.encode(), reply, (self._msg_id + key).encode(), payload)

    async def _wait(self, future: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(future, self._timeout)
        except TimeoutError:
            raise ConnectionError(
                said("no answer to a fast batch after %ss", self._timeout)
            ) from None

    def reply(self, subject: str, data: bytes, hdr: bytes | None) -> None:
        """An answer on a batch's inbox: ``<batch id>.<flow>.fail.<n>.<op>.$FI`` after it."""
        parts = subject.split(".")
        r = self._rounds.get(parts[0]) if len(parts) == 6 else None
        if r is None:
            return  # a batch that ended (the messages after a refused one are answered so)
        n = int(parts[3])
        why: Exception | None = None
        if hdr and hdr.startswith(b"NATS/1.0 "):  # a status: no stream takes it (503), full
            code = hdr[9:12].decode(errors="replace")
            text = ("no JetStream stream takes this subject" if hdr.startswith(NO_RESPONDERS)
                    else f"NATS answered status {code}")  # fmt: skip
            why = r.why.setdefault(n, RetryableError(text))
        else:
            answer = orjson.loads(data) if data else {}
            kind, error = answer.get("type"), answer.get("error")
            if kind == "err" and error is not None:
                r.why.setdefault(int(answer.get("seq", n)), error_of(error))
            elif kind is None and error is not None:
                if error.get("err_code") == GONE:  # the batch ended before this one
                    if r.started.done() and not r.done.done():
                        self._ended(r, None)  # (its PubAck came before, when it had one)
                    return
                why = r.why.setdefault(n, _unbatched(error) or error_of(error))
            elif kind is None and "batch" in answer and not r.done.done():
                r.done.set_result((answer["stream"], answer.get("seq", 0), answer["count"]))
                return
            elif kind not in ("ack", "gap"):
                return
        if n == 1 and not r.started.done():
            r.started.set_result(None)  # answered, or refused: then no other one goes
        if why is not None and n == len(r.subjects) and r.started.done():
            self._ended(r, why)

    def _ended(self, r: _Round, why: Exception | None) -> None:
        """The batch ended with no PubAck: its last message (the commit) refused (``why``), or
        the server forgot it. The stream holds those before the first refused: the answers and
        -ERRs of earlier ones came before this (nats-py reads them in order, -ERRs inline).
        When none is known refused, where it ended is not known: in doubt, as a lost
        connection is (the engine reads back what the stream took)."""
        n = len(r.subjects)
        if why is not None:
            r.why.setdefault(n, why)
        denied = [i + 1 for i, s in enumerate(r.subjects) if s.lower() in self.denied]
        refused = [k for k in r.why if k <= n] + denied
        if r.done.done():
            return
        if refused:
            r.done.set_result(("", 0, min(refused) - 1))
        else:
            r.done.set_exception(ConnectionError("the server ended a fast batch, not saying where"))

    def lost(self, error: Exception) -> None:
        """The connection is gone: no answer comes to a batch on it."""
        for r in self._rounds.values():  # the one its round awaits
            future = r.done if r.started.done() else r.started
            if not future.done():
                future.set_exception(error)


def frame(subject: bytes, reply: bytes, msg_id: bytes, payload: bytes) -> bytes:
    """A message as the protocol's HPUB frame, its ``Nats-Msg-Id`` in its headers."""
    header = HEADERS + len(msg_id)
    return _HPUB % (subject, reply, header, header + len(payload), msg_id, payload)


def _unbatched(error: dict[str, object]) -> Unbatched | None:
    code = error.get("err_code")
    if code not in UNBATCHED:
        return None
    return Unbatched(f"JetStream {error.get('code')}/{code}: {error.get('description')}",
                     off=code == UNBATCHED[0])  # fmt: skip


def error_of(error: dict[str, object]) -> Exception:
    """A JetStream API error: the failed list's (too large: never taken) or a retry's."""
    text = f"JetStream {error.get('code')}/{error.get('err_code')}: {error.get('description')}"
    return FatalError(text) if error.get("err_code") == MSG_TOO_LARGE else RetryableError(text)
