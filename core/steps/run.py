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
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from core.config.sources import PostgresSource
from core.config.steps import RouteField, Step
from core.engine.sink import BatchError
from core.envelope import Message
from core.redact import first_line, said
from core.steps import functions
from core.steps.compile import Compiled, EnrichAt, StepFailed, compile_steps
from core.steps.enrich import QUERY_TIMEOUT_MS, Enrich
from core.steps.payload import dump, load

log = logging.getLogger("weir.steps")

MAX_STUCK = 4  # calls past their time still running, beyond which function steps fail at once

Outcome = Message | None | Exception  # the message to send, dropped, or why it failed


@dataclass(slots=True)
class _Progress:
    """Where a thread running steps is: the message and when it began, and whether the loop
    has given up on it."""

    at: int
    began: float
    abandoned: bool = False


State = tuple[dict[str, Any], dict[str, str]] | None | Exception  # (message, route) so far


def enrich_sources(sources: Iterable[object]) -> dict[str, str]:
    """The URL of each Postgres source by sync id, where enrich steps send their queries."""
    return {str(s.sync_id): s.url.get_secret_value() for s in sources
            if isinstance(s, PostgresSource)}  # fmt: skip


_STUCK: defaultdict[str, list[threading.Thread]] = defaultdict(list)  # by owner, for the process


class Steps:
    def __init__(self, steps: list[Step], routes: dict[str, RouteField], records: bool,
                 timeout: float, sources: dict[str, str] | None = None,
                 owner: str = "") -> None:  # fmt: skip
        """``sources``: the URL of each Postgres source by sync id, for enrich steps;
        ``owner``: the connector or consumer whose calls past their time are counted together
        across its sessions (a change over the API makes new Steps)."""
        compiled = compile_steps(steps, routes, records)
        self.compiled = [c for c in compiled if isinstance(c, Compiled)]
        # the steps in stages: a list of steps run a message at a time, then an enrichment
        # run on the whole batch (or None at the end)
        self.stages: list[tuple[list[Compiled], Enrich | None]] = [([], None)]
        for c in compiled:
            if isinstance(c, EnrichAt):
                self.stages[-1] = (self.stages[-1][0], Enrich(c, sources or {}))
                self.stages.append(([], None))
            else:
                self.stages[-1][0].append(c)
        self.rewrites = any(c.changes_payload for c in self.compiled) or len(self.stages) > 1
        self.timeout = timeout
        self.stuck = _STUCK[owner]  # calls left running past their time

    def bound(self, n: int) -> float:
        """The longest the steps may take on a batch of ``n`` (seconds): ``timeout`` for each
        message in each stage that calls a function, and each enrich query's time limit."""
        calls = sum(any(c.calls_user for c in segment) for segment, _ in self.stages)
        queries = sum(enrich is not None for _, enrich in self.stages)
        return self.timeout * n * calls + QUERY_TIMEOUT_MS / 1000 * queries

    def one(self, m: Message) -> Outcome:
        """What the steps make of one message (steps without an enrich step)."""
        assert len(self.stages) == 1, "an enrich step runs on a batch: apply()"
        return self._finish(m, self._steps(self.compiled, self._begin(m)))

    async def apply(self, batch: Sequence[Message]) -> list[Outcome]:
        """What the steps make of each message of ``batch``."""
        if any(m.replay for m in batch):  # retried by an operator: the function as fixed
            functions.relook()
        states: list[State] = [self._begin(m) for m in batch]
        for segment, enrich in self.stages:
            if any(c.calls_user for c in segment):
                states = await self._threaded(segment, states, batch)
            elif segment:
                states = [self._steps(segment, s) for s in states]
            if enrich is not None:
                await enrich.merge(batch, states)
        return [self._finish(m, s) for m, s in zip(batch, states, strict=True)]

    async def close(self) -> None:
        for enrich in (e for _, e in self.stages if e is not None):
            await enrich.close()

    def _begin(self, m: Message) -> State:
        try:
            return load(m.payload), {}
        except (ValueError, RecursionError) as e:
            return StepFailed(said("steps: the payload is no JSON Weir can read: %s", e))

    @staticmethod
    def _steps(segment: list[Compiled], state: State) -> State:
        if not isinstance(state, tuple):
            return state
        msg, route = state
        for c in segment:
            try:
                out = c.run(msg, route)
            except Exception as e:
                return StepFailed(said("%s: %s: %s", c.name, type(e).__name__, first_line(e)))
            if out is None:
                return None
            msg = out
        return msg, route

    def _finish(self, m: Message, state: State) -> Outcome:
        if not isinstance(state, tuple):
            return state
        msg, route = state
        try:
            payload = dump(msg) if self.rewrites else m.payload
        except TypeError as e:
            return StepFailed(said("steps: the message cannot be written as JSON: %s", e))
        return Message(m.sync_id, m.provider, m.seq, m.collection_id, m.action, m.group, m.key,
                       payload, m.committed, m.attempts, m.replay, route or None)  # fmt: skip

    async def write(self, write_batch: Callable[[Sequence[Message]], Awaitable[None]],
                    batch: Sequence[Message]) -> None:  # fmt: skip
        """Run the steps on ``batch`` and write what they keep: a BatchError names the
        messages that failed, in ``batch``'s places; a dropped one succeeded."""
        outcomes = await self.apply(batch)
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

    async def _threaded(self, segment: list[Compiled], states: list[State],
                        batch: Sequence[Message]) -> list[State]:  # fmt: skip
        """``segment`` on each state in a thread, each message's bounded by ``timeout``."""
        out = list(states)
        start = 0
        loop = asyncio.get_running_loop()
        names = ", ".join(c.name for c in segment if c.calls_user)
        while start < len(out):
            self.stuck[:] = [t for t in self.stuck if t.is_alive()]
            if len(self.stuck) >= MAX_STUCK:  # each holds a thread (and maybe a core) for ever
                why = StepFailed(said("%s: %s calls still run past functions.timeout: fix the "
"function, then restart weir to end them", names, len(self.stuck)))  # fmt: skip
                return out[:start] + [why if isinstance(s, tuple) else s for s in out[start:]]
            done = loop.create_future()
            progress = _Progress(start, time.monotonic())
            thread = threading.Thread(target=self._thread, name="weir-steps", daemon=True,
                                      args=(segment, out, progress, loop, done))  # fmt: skip
            thread.start()
            while True:
                left = progress.began + self.timeout - time.monotonic()
                try:
                    await asyncio.wait_for(asyncio.shield(done), max(0.01, left))
                    return out
                except TimeoutError:
                    at = progress.at
                    if time.monotonic() - progress.began < self.timeout:
                        continue
                    progress.abandoned = True
                    self.stuck.append(thread)
                    out[at] = StepFailed(
                        said(
                            "%s: ran past functions.timeout (%ss)", names, format(self.timeout, "g")
                        )
                    )
                    log.warning("steps: seq %d (%s): a function ran past functions.timeout "
                                "(%gs); its thread is left to finish, the batch goes on",
                                batch[at].seq, batch[at].key, self.timeout)  # fmt: skip
                    start = at + 1
                    break
        return out

    def _thread(self, segment: list[Compiled], states: list[State], progress: _Progress,
                loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:  # fmt: skip
        for i in range(progress.at, len(states)):
            progress.at, progress.began = i, time.monotonic()
            got = self._steps(segment, states[i])
            if progress.abandoned:
                return
            states[i] = got
        loop.call_soon_threadsafe(_finish, done)


def _finish(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
