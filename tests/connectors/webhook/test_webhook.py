"""Webhook push connectors against a real local receiver that fails, stalls and recovers."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from pathlib import Path

import orjson
import pytest

from connectors.webhook.config import WebhookConnector
from connectors.webhook.sink import WebhookSink
from core.engine.sink import BatchError
from core.envelope import Message
from devkit.server import free_port
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers.capture import wait_for
from tests.helpers.cli import weir
from tests.helpers.sql import execute
from tests.helpers.weir import cursor_of, failed_messages, insert_t, serving, weir_config


def test_failures_and_timeouts_are_retried_until_the_receiver_recovers(
    table: str, webhook_receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    harness = WebhookHarness(webhook_receiver)
    c = harness.connector("hooks", "events", retry={"initial": "20ms", "max": "200ms"})
    c["webhook"] |= {"timeout": "300ms", "headers": {"authorization": "Bearer hook-api-key"}}
    harness.prepare(c)
    hook = harness.hook(c)
    hook.fail_next, hook.stall_next, hook.stall = 3, 2, 1.0
    with caplog.at_level(logging.DEBUG), serving(weir_config(table, [c])):
        insert_t(table, range(20))
        wait_for(lambda: cursor_of(table, "hooks")[0] == 20, what="every change acknowledged")
    got = harness.read(c)
    assert sorted(m.seq for m in got) == list(range(1, 21))
    assert len({m.key for m in got}) == 20
    assert hook.requests > 3 + 2  # the failures and the stalls were retried
    assert hook.bad_signatures == 0  # every request signed with the secret
    assert failed_messages(table, "hooks") == []
    assert "hook-api-key" not in caplog.text and "hook-secret" not in caplog.text


def test_a_receiver_that_never_recovers_fills_the_failed_list(
    table: str, webhook_receiver: Receiver
) -> None:
    harness = WebhookHarness(webhook_receiver)
    c = harness.connector("hooks", "events",
                          retry={"initial": "10ms", "max": "50ms", "max_attempts": 3})  # fmt: skip
    harness.prepare(c)
    harness.hook(c).fail_next = 10**6
    with serving(weir_config(table, [c])):
        insert_t(table, range(3))
        wait_for(lambda: cursor_of(table, "hooks")[0] == 3, what="cursor past the failures")
    failed = failed_messages(table, "hooks")
    assert [(f["seq"], f["attempts"]) for f in failed] == [(1, 3), (2, 3), (3, 3)]
    assert all("HTTP 500" in f["error"] for f in failed)
    assert harness.read(c) == []


def test_a_failed_message_is_shown_as_it_is_sent(
    table: str, webhook_receiver: Receiver, tmp_path: Path
) -> None:
    """``weir failed show`` (and the API's one entry) read the message's JSON into doubles:
    1e-400 showed as 0.0 and 1.0000000000000000000000001 as 1.0, while the receiver and a retry
    get every digit (found by an outside tryout)."""
    execute(table, "ALTER TABLE t ADD COLUMN j jsonb, ADD COLUMN e float8")
    harness = WebhookHarness(webhook_receiver)
    c = harness.connector("exact", "events", retry={"initial": "10ms", "max_attempts": 1})
    harness.prepare(c)
    harness.hook(c).fail_next = 10**6
    cfg = weir_config(table, [c])
    with serving(cfg):
        execute(table, "INSERT INTO t (id, body, j, e) VALUES (1, 'x', "
                """'{"n": 1.0000000000000000000000001}', 1e-300)""")  # fmt: skip
        wait_for(lambda: cursor_of(table, "exact")[0] == 1, what="the failed entry")
    config = tmp_path / "weir.yaml"
    config.write_text(
        orjson.dumps(
            {
                "connectors": [c],
                "sources": [
                    {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
                ],
            }
        ).decode()
    )
    shown = weir("failed", "show", "exact", "app:1", "--config", str(config))
    assert '{"n":1.0000000000000000000000001}' in shown.replace(" ", ""), shown  # a number
    assert orjson.loads(shown)["message"]["record"]["e"] == 1e-300


def test_a_wrong_secret_is_refused_by_the_receiver(table: str, webhook_receiver: Receiver) -> None:
    harness = WebhookHarness(webhook_receiver)
    c = harness.connector("hooks", "events", retry={"initial": "10ms", "max_attempts": 1})
    harness.prepare(c)
    harness.hook(c).secret = "another-secret"
    with serving(weir_config(table, [c])):
        insert_t(table, range(1))
        wait_for(lambda: cursor_of(table, "hooks")[0] == 1, what="cursor past the refusal")
    assert harness.hook(c).bad_signatures >= 1
    assert "HTTP 401" in failed_messages(table, "hooks")[0]["error"]


def test_a_post_without_an_answer_says_where_and_what_to_check() -> None:
    """A receiver nobody runs, a host that does not resolve, one that resets the connection:
    each reason names the receiver (httpx said ``ReadError: `` with nothing after it)."""
    with socket.socket() as rst:
        rst.bind(("127.0.0.1", 0))
        rst.listen()

        def reset() -> None:
            conn, _ = rst.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.recv(65536)
            conn.close()  # with SO_LINGER 0: a reset, no answer

        threading.Thread(target=reset, daemon=True).start()
        idle, resets = free_port(), rst.getsockname()[1]
        said = {url: asyncio.run(_post_one(url)) for url in (
            f"http://127.0.0.1:{idle}/hook", "http://no-such-host.invalid/hook",
            f"http://127.0.0.1:{resets}/hook")}  # fmt: skip
    assert said == {
        f"http://127.0.0.1:{idle}/hook": f"cannot connect to the receiver at 127.0.0.1:{idle}: "
        "All connection attempts failed; check webhook.url",
        "http://no-such-host.invalid/hook": "cannot connect to the receiver at "
        "no-such-host.invalid: [Errno -2] Name or service not known; check webhook.url",
        f"http://127.0.0.1:{resets}/hook": f"the receiver at 127.0.0.1:{resets} closed the "
        "connection before it answered",
    }


async def _post_one(url: str) -> str:
    sink = WebhookSink(WebhookConnector.model_validate(
        {"name": "w", "type": "webhook", "stream": "events", "webhook": {"url": url}}))  # fmt: skip
    await sink.connect()
    try:
        msg = Message("s", "p", 1, "c", "insert", "g", "k", b"{}")
        with pytest.raises(BatchError) as e:
            await sink.write_batch([msg])
        return str(e.value.failed[0])
    finally:
        await sink.close()
