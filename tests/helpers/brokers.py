"""What the contract suite and the other tests know of any broker: a message as the broker
holds it (:class:`Delivered`) and a connector's test harness (:class:`Harness`). Each connector's
harness and test server are its kit, in tests/connectors/<type>/.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Protocol

from tests.helpers.capture import wait_for

_ns = itertools.count()


def unique() -> str:
    """A name no other destination of this test session has (namespaces, topics, queues)."""
    return f"t{next(_ns)}"


@dataclass(frozen=True)
class Delivered:
    key: str  # the idempotency key the broker got with the message
    payload: dict[str, Any]
    raw: bytes = b""  # the payload's bytes, where the harness has them
    subject: str = ""  # the NATS subject it was stored under
    at: float = 0.0  # when the broker stored it (epoch seconds), where the harness has it
    where: str = ""  # what a route step decides (NATS: the subject; Kafka: the key; SQS: the
    # group id; webhook: the path after the connector's URL), where the harness has it

    @property
    def group(self) -> tuple[str, str, str | None]:
        m = self.payload["metadata"]
        return (m["sync_id"], m["collection_id"], m["record_id"])

    @property
    def seq(self) -> int:
        return int(self.payload["metadata"]["seq"])


class Harness(Protocol):
    kind: str
    route_field: str  # the route field its connectors take in a route step
    too_large: str  # what the failed list's error says of a message over the size limit
    replays: bool  # no read-back: after a restart what came after the cursor may come again

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        """A connector config with a destination of its own."""

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        """Create the destination. ``only``: collections it takes (others are refused, and
        retried); ``dedupe=False``: a duplicate window too short to hide a resend, where the
        broker has one to set.
        """

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        """Everything the destination holds, each record's messages in their order."""

    def consume(self, connector: dict[str, Any]) -> list[Delivered]:
        """What a consumer of the destination receives."""

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        """After ``prepare``: messages over ``nbytes`` can never be taken."""


def wait_delivered(
    broker: Harness, connector: dict[str, Any], n: int, *, settle: float = 0.0
) -> list[Delivered]:
    """What the broker holds once it holds ``n`` messages of the connector; ``settle`` seconds
    later, so that anything more (a duplicate) would show.
    """
    got: list[Delivered] = []

    def enough() -> bool:
        got[:] = broker.read(connector)
        return len(got) >= n

    wait_for(enough, timeout=120, what=f"{n} messages at the broker")
    if settle:
        time.sleep(settle)
        got = broker.read(connector)
    return got
