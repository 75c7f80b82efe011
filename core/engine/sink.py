"""The sink contract every connector implements (docs/design.md “Guarantees”).

The engine (engine/forwarder.py) owns ordering, batching, retries, cursors and the failed list; a
sink only moves one batch to its broker and says which messages did not make it, and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from core.envelope import BrokerMark, Message
from core.redact import said


class RetryableError(Exception):
    """The broker may take this message later: the engine retries it after a backoff."""


class FatalError(Exception):
    """The broker will never take this message (too large, rejected): it goes to the failed list."""


class BatchError(Exception):
    """Some messages of a batch failed: ``failed`` maps their index in the batch to the reason
    (a :class:`RetryableError` or :class:`FatalError`). The others were acknowledged.
    """

    def __init__(self, failed: dict[int, Exception]) -> None:
        self.failed = failed
        first = next(iter(failed.values()))
        super().__init__(said("%s messages failed, first: %s", len(failed), first))


class Sink(Protocol):
    """A broker connection. Nothing happens in the constructor; ``connect()`` opens it.

    ``write_batch`` returns when every message of the batch is acknowledged by the broker; it
    raises :class:`BatchError` for per-message failures (the broker answered). Any other
    exception means the connection is in doubt (lost, acks overdue): the engine then starts a
    new session, which sends again what was not acknowledged: a sink whose broker can be read
    (:class:`ReadBack`) first says what it took, so that nothing goes twice; for another (a
    webhook, SQS) the idempotency key is the receiver's to deduplicate by
    (docs/design.md “Guarantees”).
    """

    async def connect(self) -> None: ...

    async def write_batch(self, batch: Sequence[Message]) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class ReadBack(Protocol):
    """What a sink whose broker can be read adds (NATS JetStream, Kafka).

    ``mark()`` is the broker's position as far as acknowledgements have shown it (e.g.
    JetStream stream sequences): everything published after the call lands after it.
    ``read_back(mark, sync_ids)`` returns the idempotency keys of those sources' messages the
    broker took after ``mark``, so that a restart resends none of them.
    """

    def mark(self) -> BrokerMark: ...

    async def read_back(self, mark: BrokerMark, sync_ids: Sequence[str]) -> set[str]: ...
