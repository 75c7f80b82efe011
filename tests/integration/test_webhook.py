"""Webhook push connectors against a real local receiver that fails, stalls and recovers."""

from __future__ import annotations

import logging

import pytest

from tests.helpers.brokers import WebhookHarness
from tests.helpers.capture import wait_for
from tests.helpers.receiver import Receiver
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
