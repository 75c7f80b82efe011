"""The forwarding engine's bookkeeping rules, as plain data structures without I/O (docs/design.md
“Guarantees”): per-group order with version collapse, suspects of a lost connection, and the
broker mark a restart reads back from. core/engine/forwarder.py applies them to a session;
tests/unit/test_engine_rules.py checks them one by one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

from core.engine.sink import FatalError
from core.envelope import Message
from core.redact import said

STRIKES = 3  # connections a message alone may lose before it is charged (without max_attempts)

T = TypeVar("T")


class Groups(Generic[T]):
    """Per-record order (docs/design.md “Guarantees”): at most one message per group key is out
    (ready, in flight or in backoff); the group's next messages wait in seq order. With
    ``collapse`` (the records stream) only the newest waiting version of a record is kept.
    """

    def __init__(self, collapse: bool) -> None:
        self.collapse = collapse
        self.ready: deque[T] = deque()  # to send, in the order they became ready
        self.waiting: dict[str, deque[T]] = {}  # behind the group's message that is out
        self.busy: set[str] = set()  # groups with a message ready, in flight or in backoff

    def admit(self, group: str, item: T) -> T | None:
        """Called for each message read, in seq order. Returns the waiting older version
        ``item`` replaced (records stream): the caller settles it, as it will never be sent."""
        if group not in self.busy:
            self.busy.add(group)
            self.ready.append(item)
            return None
        queue = self.waiting.get(group)
        if queue is None:
            self.waiting[group] = deque([item])
            return None
        if self.collapse:  # only the newest version of a record matters
            older = queue.pop()
            queue.append(item)
            return older
        queue.append(item)
        return None

    def release(self, group: str) -> None:
        """Called when the group's message that was out is settled (acknowledged or moved to
        the failed list), never for one that is retried: its next message becomes ready."""
        queue = self.waiting.get(group)
        if queue:
            self.ready.append(queue.popleft())
            if not queue:
                del self.waiting[group]
        else:
            self.busy.discard(group)


class Suspects(dict[str, tuple[int, str]]):
    """Idempotency keys of messages in a batch whose connection was lost (or whose acks never
    came): each is sent alone until the broker answers for it. The value counts the
    connections it lost alone, and keeps the last error. A dict, so that the publish loop's
    ``if suspects`` and ``key in suspects`` cost what a dict's do.
    """

    def lost_connection(self, batch: Sequence[Message], error: BaseException) -> None:
        """Called when a batch's connection was lost: its messages become suspects; a suspect
        that was sent alone is charged with the loss."""
        if len(batch) == 1 and batch[0].key in self:
            strikes, _ = self[batch[0].key]
            self[batch[0].key] = (strikes + 1, f"{type(error).__name__}: {error}")
        else:
            for m in batch:
                self.setdefault(m.key, (0, ""))

    def charged(self, key: str, max_attempts: int | None) -> FatalError | None:
        """Called before a suspect goes out alone: the failure it is charged with once it lost
        the connection alone ``max_attempts`` times (``STRIKES`` when unset), else None."""
        strikes, error = self.get(key, (0, ""))
        if strikes < (max_attempts or STRIKES):
            return None
        return FatalError(
            said(
                "the broker dropped the connection (or never answered) each of "
                "the %s times this message was sent alone; last: %s",
                strikes,
                error,
            )
        )
