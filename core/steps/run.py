"""Running a connector's steps on its messages, between the store and the sink
(docs/transforms.md).

- The group key and the idempotency key were made before: a step cannot change a message's
  order or its de-duplication, only its payload and route.
- A dropped message is settled as sent, so the cursor moves past it.
- A step that raises, returns something that is not a message, or runs past ``functions.timeout``
  puts its message on the failed list (``StepFailed``, with the step and the error's first
  line); the others go on. A retry from the failed list runs the steps again.
- The payload is read as JSON with every number exact (a JSON number orjson would round is read
  as a Decimal and written back as its own text), and written again only when a step may have
  changed it.
- Steps that call a user's function run in a thread of their own, so that a slow one does not
  stop the connector's loop; one that overruns its time is left behind (a daemon thread), its
  message failed, and the rest of the batch goes on in a new thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from core.config.steps import RouteField, Step
from core.engine.sink import BatchError, FatalError
from core.envelope import Message
from core.redact import first_line
from core.steps.compile import Compiled, compile_steps

log = logging.getLogger("weir.steps")

Outcome = Message | None | Exception  # the message to send, dropped, or why it failed


class StepFailed(FatalError):
    """A message its steps could not make: it goes to the failed list at once."""


class _Big(int):
    """An integer beyond 64 bits: written back as its own digits."""


def _exact_int(text: str) -> int:
    n = int(text)
    return n if -(2**63) <= n < 2**64 else _Big(n)


def _fragment(v: Any) -> Any:
    if isinstance(v, (Decimal, _Big)):
        return orjson.Fragment(str(int(v)) if isinstance(v, _Big) else str(v))
    raise TypeError(f"{type(v).__name__} is not a JSON value")


def load(payload: bytes, exact: bool = True) -> Any:
    """A payload as JSON, every number exact: orjson's reading when writing it back gives the
    same bytes (Weir's own payloads), else (a json column's ``1.10``, a 30-digit number) the
    exact one. ``exact=False``: orjson's reading, when it can (read, not written back)."""
    try:
        fast = orjson.loads(payload)
        if not exact or orjson.dumps(fast) == payload:
            return fast
    except orjson.JSONDecodeError:
        pass
    return json.loads(payload, parse_float=Decimal, parse_int=_exact_int)


def dump(msg: Any) -> bytes:
    return orjson.dumps(msg, default=_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)


@dataclass(slots=True)
class _Progress:
    """Where a thread running steps is: the message and when it began, and whether the loop
    has given up on it."""

    at: int
    began: float
    abandoned: bool = False


class Steps:
    def __init__(self, steps: list[Step], routes: dict[str, RouteField], records: bool,
                 timeout: float) -> None:  # fmt: skip
        self.compiled: list[Compiled] = compile_steps(steps, routes, records)
        self.rewrites = any(c.changes_payload for c in self.compiled)
        self.threaded = any(c.calls_user for c in self.compiled)
        self.timeout = timeout

    def one(self, m: Message) -> Outcome:
        """What the steps make of one message."""
        try:
            msg = load(m.payload, exact=self.rewrites)
        except (ValueError, RecursionError) as e:
            return StepFailed(f"steps: the payload is no JSON Weir can read: {e}")
        route: dict[str, str] = {}
        for c in self.compiled:
            try:
                out = c.run(msg, route)
            except Exception as e:
                return StepFailed(f"{c.name}: {type(e).__name__}: {first_line(e)}")
            if out is None:
                return None
            msg = out
        try:
            payload = dump(msg) if self.rewrites else m.payload
        except TypeError as e:
            return StepFailed(f"steps: the message cannot be written as JSON: {e}")
        return Message(m.sync_id, m.provider, m.seq, m.collection_id, m.action, m.group, m.key,
                       payload, m.committed, m.attempts, m.replay, route or None)  # fmt: skip

    async def write(self, write_batch: Callable[[Sequence[Message]], Awaitable[None]],
                    batch: Sequence[Message]) -> None:  # fmt: skip
        """Run the steps on ``batch`` and write what they keep: a BatchError names the
        messages that failed, in ``batch``'s places; a dropped one succeeded."""
        outcomes = await self._run(batch) if self.threaded else [self.one(m) for m in batch]
        failed: dict[int, Exception] = {}
        places, out = [], []
        for i, o in enumerate(outcomes):
            if isinstance(o, Exception):
                failed[i] = o
            elif o is not None:
                places.append(i)
                out.append(o)
        if out:
            try:
                await write_batch(out)
            except BatchError as e:
                failed.update({places[j]: err for j, err in e.failed.items()})
        if failed:
            raise BatchError(failed)

    async def _run(self, batch: Sequence[Message]) -> list[Outcome]:
        """``one`` of each message in a thread, each call bounded by ``timeout``."""
        outcomes: list[Outcome] = [None] * len(batch)
        start = 0
        loop = asyncio.get_running_loop()
        while start < len(batch):
            done = loop.create_future()
            progress = _Progress(start, time.monotonic())
            threading.Thread(target=self._thread, args=(batch, outcomes, progress, loop, done),
                             name="weir-steps", daemon=True).start()  # fmt: skip
            while True:
                left = progress.began + self.timeout - time.monotonic()
                try:
                    await asyncio.wait_for(asyncio.shield(done), max(0.01, left))
                    return outcomes
                except TimeoutError:
                    at = progress.at
                    if time.monotonic() - progress.began < self.timeout:
                        continue
                    progress.abandoned = True
                    outcomes[at] = StepFailed(f"steps: a function ran past functions.timeout "
                                              f"({self.timeout:g}s)")  # fmt: skip
                    log.warning("steps: seq %d (%s): a function ran past functions.timeout "
                                "(%gs); its thread is left to finish, the batch goes on",
                                batch[at].seq, batch[at].key, self.timeout)  # fmt: skip
                    start = at + 1
                    break
        return outcomes

    def _thread(self, batch: Sequence[Message], outcomes: list[Outcome], progress: _Progress,
                loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:  # fmt: skip
        for i in range(progress.at, len(batch)):
            progress.at, progress.began = i, time.monotonic()
            got = self.one(batch[i])
            if progress.abandoned:
                return
            outcomes[i] = got
        loop.call_soon_threadsafe(_finish, done)


def _finish(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
