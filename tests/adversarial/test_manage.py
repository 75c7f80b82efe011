"""The management API and its CLI twins through real HTTP and real processes (docs/operations.md
“Management API and CLI”): failed lists that can be paged, shown, retried (in order for each record)
and discarded (for good, across a restart); connectors paused with their cursor held and resumed;
connectors made over the API. Here with the cases an outside tryout broke: URL passwords and
masks sent back, a file connector named as an API-made one, unknown ids and consumers, a
retried entry failing again, a second pause.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from core.redact import redact
from core.runtime.service import serve
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers.api import api_serving
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, insert_t, store_events, weir_config


def hooks_refusing(receiver: Receiver) -> tuple[WebhookHarness, dict[str, Any]]:
    """A webhook connector ``hooks`` whose receiver refuses everything until told otherwise;
    one attempt each, so every change lands on the failed list."""
    harness = WebhookHarness(receiver)
    c = harness.connector("hooks", "events", retry={"initial": "10ms", "max_attempts": 1})
    harness.prepare(c)
    harness.hook(c).fail_next = 10**6
    return harness, c


def weir_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "core.cli", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def write_config(tmp_path: Path, table: str, connectors: list[dict[str, Any]]) -> Path:
    config = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    config.write_text(json.dumps({"sources": [source], "connectors": connectors}))
    return config


def failed_ids(client: httpx.Client, name: str = "hooks") -> list[str]:
    r = client.get(f"/v1/connectors/{name}/failed", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [e["id"] for e in r.json()["data"]]


def test_retry_all_sends_each_record_in_order_and_empties_the_list(
    table: str, webhook_receiver: Receiver
) -> None:
    harness, c = hooks_refusing(webhook_receiver)
    with api_serving(table, connectors=[c]) as client:
        insert_t(table, range(2))  # seq 1: record 0, seq 2: record 1
        with psycopg.connect(table, autocommit=True) as conn:
            for body in ("y", "z"):  # seqs 3 and 4: record 0 again
                conn.execute("UPDATE t SET body = %s WHERE id = 0", (body,))
        wait_for(lambda: len(failed_ids(client)) == 4, what="four changes on the failed list")
        assert failed_ids(client) == ["app:1", "app:2", "app:3", "app:4"]
        wait_for(lambda: cursor_of(table, "hooks")[0] == 4, what="the cursor past them")
        harness.hook(c).fail_next = 0  # the receiver is fixed
        r = client.post("/v1/connectors/hooks/failed/retry", json={"all": True})
        assert r.json() == {"count": 4}
        wait_for(lambda: failed_ids(client) == [], what="the retried messages delivered")
        got = [m.seq for m in harness.read(c)]
        record_0 = [s for s in got if s != 2]
        assert record_0 == [1, 3, 4]  # record 0's changes in their order
        assert sorted(got) == [1, 2, 3, 4]  # each once
        assert cursor_of(table, "hooks")[0] == 4  # the cursor never went back
        body = client.get("/v1/connectors/hooks").json()
        assert body["failed"] == 0 and body["shards"][0]["state"] == "streaming"

        def history() -> list[dict[str, Any]]:
            return client.get("/v1/connectors/hooks/history").json()  # type: ignore[no-any-return]

        wait_for(lambda: len(history()) >= 2, what="two samples of the last hour")  # every 5 s
        last = history()[-1]
        assert set(last) == {"t", "rate", "lag_messages", "lag_seconds"}
        assert last["lag_messages"] == 0 and last["t"] > time.time() - 60
        assert client.get("/v1/connectors/nope/history").status_code == 404


def test_a_failed_page_show_and_the_paging(table: str, webhook_receiver: Receiver) -> None:
    _, c = hooks_refusing(webhook_receiver)
    with api_serving(table, connectors=[c]) as client:
        insert_t(table, range(5))
        wait_for(lambda: len(failed_ids(client)) == 5, what="five on the failed list")
        pages, after = [], None
        while True:
            params = {"limit": 2} | ({"after": after} if after else {})
            body = client.get("/v1/connectors/hooks/failed", params=params).json()
            pages.append([e["seq"] for e in body["data"]])
            after = body["next"]
            if after is None:
                break
        assert pages == [[1, 2], [3, 4], [5]]
        one = client.get("/v1/connectors/hooks/failed/app:3").json()
        assert one["attempts"] == 1 and "HTTP 500" in one["error"]
        assert one["message"]["metadata"]["seq"] == 3
        assert one["message"]["record"]["id"] == 2
        assert client.get("/v1/connectors/hooks/failed/app:99").status_code == 404
        assert client.get("/v1/connectors/hooks/failed/bogus").status_code == 400
        # Retried while the receiver still refuses: back on the list, its attempts added up.
        assert client.post("/v1/connectors/hooks/failed/app:3/retry").json() == {"count": 1}

        def failed_again() -> bool:
            e = client.get("/v1/connectors/hooks/failed/app:3").json()
            return not e["retry_requested"] and e["attempts"] == 2  # type: ignore[no-any-return]

        wait_for(failed_again, what="app:3 to fail again")
        assert client.get("/v1/connectors/nope/failed").status_code == 404
        r = client.post("/v1/connectors/hooks/failed/retry", json={"ids": [], "all": True})
        assert r.status_code == 422  # one or the other
        r = client.post("/v1/connectors/hooks/failed/retry", json={"ids": ["3"]})
        assert r.status_code == 400 and "SOURCE:SEQ" in r.json()["detail"]
        assert httpx.get(f"{client.base_url}/v1/connectors/hooks/failed").status_code == 401


def test_discard_is_final_across_a_restart_and_the_cli_does_the_same(
    tmp_path: Path, table: str, webhook_receiver: Receiver
) -> None:
    harness, c = hooks_refusing(webhook_receiver)
    config = write_config(tmp_path, table, [c])
    with api_serving(table, connectors=[c]) as client:
        insert_t(table, range(5))
        wait_for(lambda: len(failed_ids(client)) == 5, what="five on the failed list")
        assert client.delete("/v1/connectors/hooks/failed/app:1").json() == {"count": 1}
        assert client.delete("/v1/connectors/hooks/failed/app:1").status_code == 404
    out = weir_cli(config, "failed", "discard", "hooks", "app:2")
    assert out.returncode == 0 and "1 failed messages discarded" in out.stdout, out.stderr
    listed = weir_cli(config, "failed", "list", "hooks")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["app:3", "app:4", "app:5"]
    shown = weir_cli(config, "failed", "show", "hooks", "app:4")
    assert json.loads(shown.stdout)["message"]["metadata"]["seq"] == 4
    assert weir_cli(config, "failed", "retry", "hooks").returncode == 2  # ids or --all
    assert weir_cli(config, "failed", "list", "nope").returncode == 2
    assert weir_cli(config, "failed", "list", "consumer:nope").returncode == 2
    out = weir_cli(config, "failed", "discard", "hooks", "app:4", "app:99")
    assert out.returncode == 1 and "1 of the ids given are not on the list" in out.stderr
    harness.hook(c).fail_next = 0
    out = weir_cli(config, "failed", "retry", "hooks", "app:3")
    assert "1 failed messages sent again" in out.stdout, out.stderr
    with api_serving(table, first=False, connectors=[c]) as client:  # a restart
        wait_for(lambda: failed_ids(client) == ["app:5"], what="app:3 retried after the restart")
        assert [m.seq for m in harness.read(c)] == [3]  # never 1 or 2
        assert client.post("/v1/connectors/hooks/failed/app:1/retry").status_code == 404


def test_pause_holds_the_cursor_and_resume_goes_on(
    tmp_path: Path, table: str, webhook_receiver: Receiver
) -> None:
    harness = WebhookHarness(webhook_receiver)
    c = harness.connector("hooks", "events")
    harness.prepare(c)
    config = write_config(tmp_path, table, [c])
    with api_serving(table, connectors=[c]) as client:
        insert_t(table, range(3))
        wait_for(lambda: cursor_of(table, "hooks")[0] == 3, what="three delivered")
        r = client.post("/v1/connectors/hooks/pause")
        assert r.status_code == 200 and r.json()["paused"] is True
        since = r.json()["shards"][0]["detail"]
        time.sleep(1.1)
        again = client.post("/v1/connectors/hooks/pause").json()["shards"][0]["detail"]
        assert again == since  # paused since the first time

        def shard() -> dict[str, Any]:
            return client.get("/v1/connectors/hooks").json()["shards"][0]  # type: ignore[no-any-return]

        wait_for(lambda: shard()["owner"] is None, what="the connector stopped")
        insert_t(table, range(3, 10))
        wait_for(lambda: shard()["lag_messages"] == 7, what="the lag to show the new rows")
        time.sleep(1.5)  # a lease poll or two: nobody runs it
        assert cursor_of(table, "hooks")[0] == 3
        assert shard()["state"] == "paused"
        out = weir_cli(config, "status", "--interval", "0.1")
        states = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("hooks")}
        assert states == {"paused"}, out.stdout  # its row of each source
        assert len(harness.read(c)) == 3
    with api_serving(table, first=False, connectors=[c]) as client:  # a pause outlives a restart
        time.sleep(1.5)
        assert cursor_of(table, "hooks")[0] == 3
        out = weir_cli(config, "connector", "resume", "hooks")
        assert out.returncode == 0 and "resumed" in out.stdout, out.stderr
        wait_for(lambda: cursor_of(table, "hooks")[0] == 10, what="the rest delivered")
        assert sorted(m.seq for m in harness.read(c)) == list(range(1, 11))
        assert client.get("/v1/connectors/hooks").json()["paused"] is False
    assert weir_cli(config, "connector", "pause", "nope").returncode == 2


def test_sources_connectors_and_consumers_are_listed(table: str) -> None:
    consumer = {"name": "w", "stream": "events", "max_deliver": 1, "ack_wait_ms": 200}
    with api_serving(table, consumers=[consumer]) as client:
        insert_t(table, range(2))
        wait_for(lambda: client.get("/v1/sources").json()[0]["state"] == "streaming",
                 what="app streaming")  # fmt: skip
        app = client.get("/v1/sources").json()[0]
        assert (app["name"], app["kind"], app["events_seq"]) == ("app", "postgres", 2)
        assert app["slot_lag_bytes"] is not None and "/" in app["last_lsn"]
        assert client.get("/v1/connectors").json() == []

        def nacked_twice() -> bool:  # delivered once (max_deliver 1), then failed
            got = client.get("/v1/http-consumers/w/next", params={"batch_size": 10}).json()
            return not got["data"] and client.get("/v1/consumers").json()[0]["failed"] == 2

        wait_for(nacked_twice, what="both messages on the consumer's failed list")
        ids = [e["id"] for e in client.get("/v1/http-consumers/w/failed").json()["data"]]
        assert ids == ["app:1", "app:2"]
        r = client.post("/v1/http-consumers/w/failed/app:1/retry")
        assert r.json() == {"count": 1}
        got = client.get("/v1/http-consumers/w/next").json()["data"]
        assert [m["record"]["seq"] for m in got] == [1]  # back in the queue
        assert client.post("/v1/http-consumers/w/failed/discard", json={"all": True}).json() == {
            "count": 1
        }
        assert client.get("/v1/consumers").json()[0]["failed"] == 0
        assert client.get("/v1/http-consumers/nope/failed").status_code == 404
        paths = client.get("/openapi.json").json()["paths"]
        for route in ("/v1/sources", "/v1/connectors/{name}/pause",
                      "/v1/connectors/{name}/failed/{entry}/retry",
                      "/v1/http-consumers/{name}/failed/discard"):  # fmt: skip
            assert route in paths


def test_refused_bodies_leave_nothing_behind(table: str) -> None:
    """A body that does not validate has its secrets masked in its own 422, and nothing of it
    is kept: what clients send cannot grow the API's memory (a fuzzer's invalid bodies, each
    kept as a secret to mask in everything later, grew the process to 23 GB)."""
    with api_serving(table) as client:
        sent = [f"not-kept-{i:04d}-secret" for i in range(200)]
        for secret in sent:
            hook = {"url": "http://127.0.0.1:1/x", "secret": secret}
            body = {"name": "x", "type": "webhook", "max_in_flight": 0, "webhook": hook}
            r = client.post("/v1/connectors", json=body)
            assert r.status_code == 422 and secret not in r.text, r.text
        kept = [s for s in sent if redact(f"{s} in a later log line") != f"{s} in a later log line"]
        assert kept == []


def test_connectors_made_changed_and_deleted_over_the_api_run_without_a_restart(
    tmp_path: Path, table: str, webhook_receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    harness = WebhookHarness(webhook_receiver)
    declared = harness.connector("declared", "events")
    harness.prepare(declared)
    made = harness.connector("made", "events", start_position="beginning")
    harness.prepare(made)
    config = write_config(tmp_path, table, [declared])
    with api_serving(table, connectors=[declared]) as client:
        insert_t(table, range(3))
        r = client.post("/v1/connectors", json=made)
        assert r.status_code == 201, r.text
        assert r.json()["origin"] == "api"
        assert r.json()["config"]["webhook"]["secret"] == "**********"  # never shown
        wait_for(lambda: cursor_of(table, "made")[0] == 3, what="the new connector delivering")
        assert sorted(m.seq for m in harness.read(made)) == [1, 2, 3]
        names = {c["name"]: c["origin"] for c in client.get("/v1/connectors").json()}
        assert names == {"declared": "config", "made": "api"}
        # The same models as YAML: a 422 names the field.
        bad = client.post("/v1/connectors", json={**made, "name": "x", "max_in_flight": 0})
        assert bad.status_code == 422
        assert [e["loc"] for e in bad.json()["detail"]] == [["body", "max_in_flight"]]
        bad = client.post("/v1/connectors", json={**made, "name": "y", "sources": ["nope"]})
        assert bad.status_code == 422 and "nope" in str(bad.json()["detail"])
        assert client.post("/v1/connectors", json=made).status_code == 409  # exists
        assert client.post("/v1/connectors", json=declared).status_code == 409  # the file's
        assert client.delete("/v1/connectors/declared").status_code == 409  # read-only
        # What GET shows, sent back, keeps the secrets (not their masks): still signed right.
        shown = client.get("/v1/connectors/made/config").json()["config"]
        assert shown["webhook"]["secret"] == "**********"
        r = client.put("/v1/connectors/made", json=shown)
        assert r.status_code == 200, r.text
        time.sleep(2.5)  # restarted with the config sent back
        insert_t(table, range(100, 101))
        wait_for(lambda: len(harness.read(made)) == 4, what="a message after the change")
        assert harness.hook(made).bad_signatures == 0
        masked = {**made, "webhook": {**made["webhook"], "secret": "**********"}, "name": "z"}
        r = client.post("/v1/connectors", json=masked)  # a mask it was never shown
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == [
            "body",
            "webhook",
            "secret",
        ]
        # A change of collections takes effect from the cursor on.
        changed = {**made, "collections": ["public:nothing"]}
        assert client.put("/v1/connectors/made", json=changed).status_code == 200
        assert client.put("/v1/connectors/made", json={**changed, "stream": "records"}
                          ).status_code == 409  # fmt: skip
        moved = client.put("/v1/connectors/made", json={**changed, "start_position": "end"})
        assert moved.status_code == 409 and "delete it and make it again" in moved.text
        wait_for(lambda: client.get("/v1/connectors/made/config").json()["config"]["collections"]
                 == ["public:nothing"], what="the change stored")  # fmt: skip
        time.sleep(2.5)  # a lease poll or two: the shard restarted with its new config
        insert_t(table, range(3, 5))
        wait_for(lambda: cursor_of(table, "made")[0] == 6, what="the cursor past the new rows")
        assert sorted(m.seq for m in harness.read(made)) == [1, 2, 3, 4]  # filtered from seq 5
        # The CLI sees API-made connectors too.
        assert weir_cli(config, "failed", "list", "made").returncode == 0
        assert client.delete("/v1/connectors/made").status_code == 200
        assert client.get("/v1/connectors/made").status_code == 404
        wait_for(lambda: "made" not in client.get("/v1/connectors").text, what="it is gone")
        time.sleep(2.5)
        insert_t(table, range(5, 7))
        wait_for(lambda: cursor_of(table, "declared")[0] == 8, what="declared goes on")
        assert len(harness.read(made)) == 4  # nothing more once deleted
        assert client.post("/v1/connectors", json={**made, "name": "clash"}).status_code == 201
    # A file that declares a connector made over the API: weir run refuses, naming it.
    clash = {**declared, "name": "clash"}
    with caplog.at_level(logging.ERROR):
        assert serve(weir_config(table, [declared, clash]), threading.Event()) == 1
    assert "declares connectors that were made over the API: clash;" in caplog.text


def test_a_connector_made_over_the_api_at_end_gets_every_change_after_its_201(
    table: str, webhook_receiver: Receiver
) -> None:
    """start_position end counts from when the API answered 201, not from the first start a
    lease poll later (changes committed in between were skipped: found by an outside tryout)."""
    harness = WebhookHarness(webhook_receiver)
    with api_serving(table) as client:
        insert_t(table, range(3))  # before: not for it
        wait_for(lambda: len(store_events(table)) == 3, what="the first rows stored")
        made = harness.connector("late", "events", start_position="end")
        harness.prepare(made)
        assert client.post("/v1/connectors", json=made).status_code == 201
        insert_t(table, range(3, 6))  # at once: before any lease poll can have started it
        wait_for(lambda: len(harness.read(made)) == 3, what="the three rows after the 201")
        time.sleep(0.5)
        assert sorted(m.seq for m in harness.read(made)) == [4, 5, 6]
