"""Findings of a fifth Nov 29 outside try-out of steps (docs/transforms.md), against real
servers (PostgreSQL, nats-server, the HTTP API and its console). Each test is one promise of
the docs the try-out found broken on the current code; its docstring quotes the promise and
tells what was seen. (The findings of test_tryout_steps_nov29.py … nov29d.py and
test_consume_steps.py are not repeated.)"""

from __future__ import annotations

import asyncio
import time

import httpx
import psycopg
import pytest

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.api import TOKEN, api_serving
from tests.helpers.capture import wait_for
from tests.helpers.weir import insert_t, serving, weir_config


def test_the_console_page_of_a_connector_adding_a_big_integer_is_a_500(table: str) -> None:
    """docs/transforms.md: “The console's connector page and the management API show a
    connector's steps.” With ``transform: {add: {n: 100000000000000000000000}}`` (a number the
    steps now send as its digits, and the management API shows as such), GET
    ``/console/connectors/hooks`` answers 500 Internal Server Error: core/api/console/present.py
    ``step`` writes each key with plain ``orjson.dumps``, which raises ``TypeError: Integer
    exceeds 64-bit range``. The connector page cannot be opened at all, so neither can its
    pause, resume or failed-list buttons."""
    c = {"name": "hooks", "type": "webhook", "stream": "events",
         "webhook": {"url": "http://127.0.0.1:9/"},
         "steps": [{"transform": {"add": {"n": 100000000000000000000000}}}]}  # fmt: skip
    with api_serving(table, connectors=[c]) as api:
        shown = api.get("/v1/connectors/hooks")
        assert shown.status_code == 200, shown.text
        assert "100000000000000000000000" in shown.text, shown.text
        with httpx.Client(base_url=api.base_url, timeout=30) as client:
            assert client.post("/console/login", data={"token": TOKEN}).status_code == 303
            page = client.get("/console/connectors/hooks")
    assert page.status_code == 200, page.text[:300]
    assert "100000000000000000000000" in page.text


@pytest.mark.xfail(strict=True, reason=(
    "a records-stream route sharing a subject keeps its last record "
    "(docs/design.md “Known limits”)"))  # fmt: skip
def test_a_routed_records_stream_keeps_one_record_a_subject(
    nats_server: EmbeddedNats, table: str
) -> None:
    """docs/transforms.md “Route”: “A routed NATS connector's subjects stay under
    `sequin-{stream}.{namespace}.>`, so the streams `weir nats setup` makes take them”, and
    docs/configuration.md: ``stream: records``: “each record's newest version”. The records
    stream `weir nats setup` makes keeps ``max_msgs_per_subject: 1`` (one message per record
    subject), and a route puts several records on one subject: with ``route: {subject:
    "t.{record.body}"}`` on ``stream: records``, rows 1, 2, 3 of body ``a`` and then row 1 moved
    to ``b``, the stream holds only ``t.a`` → record 3 and ``t.b`` → record 1: record 2's newest
    (and only) version is gone from the records stream, with no word from ``weir config
    validate``, the connector or its log (a route over a field that changes would likewise
    leave a record's old version in its old subject for good)."""
    h = NatsHarness(nats_server)
    c = h.connector("r", "records", steps=[{"route": {"subject": "t.{record.body}"}}])
    asyncio.run(ensure_streams(NatsConnector.model_validate(c)))  # as `weir nats setup` makes it
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 4), body="a")
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE t SET body = 'b' WHERE id = 1")
        wait_for(lambda: any(d.payload["record"]["body"] == "b" for d in h.read(c)),
                 what="record 1's move to b sent")  # fmt: skip
        time.sleep(1)
    got = {d.payload["record"]["id"]: d.payload["record"]["body"] for d in h.read(c)}
    assert got == {1: "b", 2: "a", 3: "a"}, got
