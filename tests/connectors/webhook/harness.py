"""The webhook kit's harness: a path per connector on the kit's receiver."""

from __future__ import annotations

from typing import Any

from tests.connectors.webhook.receiver import Hook, Receiver
from tests.helpers.brokers import Delivered, unique


class WebhookHarness:
    """Webhooks to a local receiver (receiver.py beside this file), a path per connector."""

    kind = "webhook"
    route_field = "path"
    too_large = "HTTP 413"
    replays = True

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def hook(self, connector: dict[str, Any]) -> Hook:
        return self.receiver.hooks[connector["webhook"]["url"].removeprefix(self.receiver.url)]

    def connector(self, name: str, stream: str, **extra: Any) -> dict[str, Any]:
        url = f"{self.receiver.url}/hooks/{name}-{unique()}"
        hook = {"url": url, "secret": "hook-secret", "timeout": "2s"}
        return {"name": name, "type": "webhook", "stream": stream, "webhook": hook, **extra}

    def prepare(
        self, connector: dict[str, Any], *, only: list[str] | None = None, dedupe: bool = True
    ) -> None:
        path = connector["webhook"]["url"].removeprefix(self.receiver.url)
        self.receiver.hooks[path] = Hook(secret=connector["webhook"]["secret"], only=only)

    def read(self, connector: dict[str, Any]) -> list[Delivered]:
        with self.receiver.lock:
            hook = self.hook(connector)
            taken = list(zip(hook.taken, hook.paths, strict=True))
        return [Delivered(m["metadata"]["idempotency_key"], m, where=path) for m, path in taken]

    consume = read

    def limit_size(self, connector: dict[str, Any], nbytes: int) -> None:
        self.hook(connector).max_bytes = nbytes
