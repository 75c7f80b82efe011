"""Weir with its HTTP API in the test process, and a client for it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from core.config.model import WeirConfig
from devkit.server import free_port
from tests.helpers.capture import wait_for
from tests.helpers.weir import serving

TOKEN = "test-token-0123456789"


def api_config(db_url: str, port: int, **extra: Any) -> WeirConfig:
    """A postgres source ``app`` (schema public), an http source ``stripe``, the API on
    ``port``, plus ``extra`` top-level keys (consumers, connectors).
    """
    spec: dict[str, Any] = {
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]},
        "sources": [
            {"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]},
            {"name": "stripe", "kind": "http", "provider": "stripe"},
        ],
    }
    spec.update(extra)
    return WeirConfig.model_validate(spec)


@contextmanager
def api_serving(
    db_url: str, port: int | None = None, first: bool = True, **extra: Any
) -> Iterator[httpx.Client]:
    """``weir run`` with the API (beside another instance on the store unless ``first``);
    yields a client that sends the token."""
    port = port or free_port()
    with (
        serving(api_config(db_url, port, **extra), first),
        httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        ) as client,
    ):

        def listening() -> bool:
            try:
                return client.get("/v1/http-consumers").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(listening, what="the API to listen")
        yield client


def change(client: httpx.Client, connector: dict[str, Any], **changes: Any) -> None:
    """``connector`` changed over the API by ``changes``, its shards restarted with them."""
    r = client.put(f"/v1/connectors/{connector['name']}", json={**connector, **changes})
    assert r.status_code == 200, r.text
    time.sleep(2)  # its shards restarted with the new config


def receive(client: httpx.Client, consumer: str, n: int = 10, **params: Any) -> list[Any]:
    r = client.get(f"/v1/http-consumers/{consumer}/next", params={"batch_size": n, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def settle(client: httpx.Client, consumer: str, items: list[Any], verb: str = "ack") -> int:
    body = {"ack_tokens": [i["ack_token"] for i in items]}
    r = client.post(f"/v1/http-consumers/{consumer}/{verb}", json=body)
    assert r.status_code == 200, r.text
    return int(r.json()["count"])


def wait_queued(client: httpx.Client, consumer: str, n: int) -> None:
    """Wait until ``n`` messages are queued for the consumer and visible."""

    def queued() -> bool:
        return int(client.get(f"/v1/http-consumers/{consumer}").json()["info"]["num_pending"]) >= n

    wait_for(queued, what=f"{n} messages queued for {consumer}")


def receive_all(client: httpx.Client, consumer: str, count: int, timeout: float = 30) -> list[Any]:
    """Receive and ack until ``count`` messages came; returns them in the order received."""
    got: list[Any] = []

    def more() -> bool:
        batch = receive(client, consumer, 100)
        if batch:
            settle(client, consumer, batch)
            got.extend(batch)
        return len(got) >= count

    wait_for(more, timeout, f"{count} messages for {consumer}")
    return got


def all_handled(client: httpx.Client, name: str) -> tuple[list[Any], list[Any]]:
    """Everything HTTP pull consumer ``name``'s queue gives until none is pending (received,
    not acked), and its failed list."""
    got: list[Any] = []

    def done() -> bool:
        got.extend(receive(client, name))
        info = client.get(f"/v1/http-consumers/{name}").json()["info"]
        return bool(info["num_pending"] == 0 and info["num_ack_pending"] == len(got))

    time.sleep(1)  # the captured rows reach the queue
    wait_for(done, what=f"{name}'s messages handled")
    failed = client.get(f"/v1/http-consumers/{name}/failed").json()["data"]
    return got, list(failed)
