"""A connector's steps against real servers (docs/transforms.md): what a NATS subscriber gets
after a filter, a declarative transform and a route; a function that raises or hangs on one
record (its message on the failed list with the reason, the others delivered in order, and the
fixed function delivering it on retry); order and exactly-once with steps across SIGKILL.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from core.config.load import load_config
from core.config.model import WeirConfig
from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.api import api_serving, receive, receive_all
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.functions import write_module
from tests.helpers.load import (
    WeirProcess,
    check_delivered,
    crash_connectors,
    create_load_table,
    load_with_interruptions,
    wait_all_delivered,
)
from tests.helpers.weir import cursor_of, insert_t, serving, weir_config


def orders(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, tenant text, total numeric,"
                     " card text, meta jsonb)")  # fmt: skip
        conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")  # an update's changes


def test_filter_transform_and_route_shape_what_a_subscriber_gets(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    orders(db_url)
    nats = NatsHarness(nats_server)
    steps = [
        {"filter": 'action != "delete" and record.tenant != "skip"'},
        {"transform": {"drop": ["card"], "rename": {"total": "amount"},
                       "add": {"table": "{metadata.table_name}", "source": "weir"}}},
        {"route": {"subject": "orders.{record.tenant}"}},
    ]  # fmt: skip
    c = nats.connector("shaped", "events", steps=steps)
    nats.prepare(c)
    with serving(weir_config(db_url, [c])), psycopg.connect(db_url, autocommit=True) as conn:
        # a tenant with a dot, a space and a wildcard is one subject token; a json number
        # with more digits than a double holds keeps them
        for i, tenant in enumerate(["eu", "us", "a.b *>", "skip"], 1):
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s, '4111', %s)",
                         (i, tenant, f"{i}.10", '{"n": 0.10000000000000000555}'))  # fmt: skip
        conn.execute("UPDATE orders SET total = 9.99, card = '5500' WHERE id = 1")
        conn.execute("DELETE FROM orders WHERE id = 2")
        got = wait_delivered(nats, c, 4, settle=1.0)
        wait_for(lambda: cursor_of(db_url, "shaped")[0] == 6, what="the cursor past the drops")
    assert len(got) == 4
    by = {(d.payload["action"], d.payload["record"]["id"]): d for d in got}
    assert set(by) == {("insert", 1), ("insert", 2), ("insert", 3), ("update", 1)}
    ns = c["nats"]["namespace"]
    assert by["insert", 1].subject == f"sequin-events.{ns}.orders.eu"
    assert by["insert", 3].subject == f"sequin-events.{ns}.orders.a%2Eb%20%2A%3E"
    update = by["update", 1].payload
    assert update["record"] == {
        "id": 1,
        "tenant": "eu",
        "amount": "9.99",
        "table": "orders",
        "source": "weir",
        "meta": {"n": 0.10000000000000000555},
    }
    assert update["changes"] == {"amount": "1.10"}  # card dropped from changes too
    assert b'"n":0.10000000000000000555' in by["update", 1].raw  # every digit kept
    assert update["metadata"]["record_id"] == "1"  # the envelope's metadata as it was


def failed(client: httpx.Client, name: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/connectors/{name}/failed", params={"limit": 100})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_a_function_that_raises_fails_its_message_alone_and_fixed_it_delivers_on_retry(
    table: str, nats_server: EmbeddedNats, functions_dir: Path
) -> None:
    shaping = functions_dir / "shaping.py"
    write_module(shaping, "def shape(action, record, changes, metadata):\n"
                    "    if record['id'] == 2:\n"
                    "        raise ValueError('no twos here\\nsecond line')\n"
                    "    return {'id': record['id'], 'op': action}\n")  # fmt: skip
    nats = NatsHarness(nats_server)
    c = nats.connector("fn", "events", steps=[{"transform": {"function": "shaping:shape"}}])
    nats.prepare(c)
    with api_serving(table, connectors=[c]) as client, \
            psycopg.connect(table, autocommit=True) as conn:  # fmt: skip
        for i in range(1, 5):
            conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
        conn.execute("UPDATE t SET body = 'y' WHERE id = 3")
        wait_for(lambda: len(failed(client, "fn")) == 1, what="the failing message listed")
        got = wait_delivered(nats, c, 4, settle=0.5)
        assert [d.payload for d in got] == [
            {"id": 1, "op": "insert"},
            {"id": 3, "op": "insert"},
            {"id": 4, "op": "insert"},
            {"id": 3, "op": "update"},
        ]
        entry = failed(client, "fn")[0]
        assert entry["id"] == "app:2"
        assert entry["error"] == "StepFailed: steps[0] transform: ValueError: no twos here"
        write_module(shaping, "def shape(action, record, changes, metadata):\n"
                        "    return {'id': record['id'], 'op': action,\n"
                        "            'fixed': True}\n")  # fmt: skip
        assert client.post("/v1/connectors/fn/failed/retry", json={"all": True}).json() == {
            "count": 1}  # fmt: skip
        wait_for(lambda: failed(client, "fn") == [], what="the retried message delivered")
        got = wait_delivered(nats, c, 5)
        assert got[-1].payload == {"id": 2, "op": "insert", "fixed": True}
        # Over the API: the same checks as the file's (422 naming the step), and a change of
        # steps applies from the cursor on without a restart.
        for steps, why in (
            ([{"filter": "record.__class__"}], "'__class__' is not allowed"),
            ([{"transform": {"function": "shaping:nope"}}], "no function nope"),
            ([{"route": {"topic": "x"}}], "takes subject in a route"),
        ):
            r = client.put("/v1/connectors/fn", json={**c, "steps": steps})
            assert r.status_code == 422 and why in r.text, r.text
        made = {**nats.connector("made", "events"), "start_position": "end"}
        nats.prepare(made)
        r = client.post("/v1/connectors", json={**made, "steps": [{"transform": {"keep": ["id"]}}]})
        assert r.status_code == 201, r.text
        wait_for(lambda: cursor_of(table, "made")[0] >= 0, what="the new connector started")
        conn.execute("INSERT INTO t VALUES (20, 'x')")
        assert wait_delivered(nats, made, 1)[0].payload["record"] == {"id": 20}
        r = client.put("/v1/connectors/made", json={**made, "steps": [
            {"transform": {"keep": ["body"]}}]})  # fmt: skip
        assert r.status_code == 200, r.text
        ids = iter(range(21, 1000))

        def switched() -> bool:  # a row a poll, until one comes shaped by the new steps
            conn.execute("INSERT INTO t VALUES (%s, 'y')", (next(ids),))
            return any("body" in d.payload["record"] for d in nats.read(made))

        wait_for(switched, what="the changed steps applied")
        shapes = [sorted(d.payload["record"]) for d in nats.read(made)]
        new = shapes.index(["body"])  # from the cursor on: the old steps before, the new after
        assert shapes[:new] == [["id"]] * new and shapes[new:] == [["body"]] * (len(shapes) - new)


def test_a_function_past_its_time_limit_fails_that_message_and_the_rest_go_on(
    tmp_path: Path, table: str, nats_server: EmbeddedNats, functions_dir: Path
) -> None:
    write_module(functions_dir / "slow.py", "import time\n"
                                      "def shape(action, record, changes, metadata):\n"
                                      "    if record['id'] == 2:\n"
                                      "        time.sleep(5)\n"
                                      "    return {'id': record['id']}\n")  # fmt: skip
    nats = NatsHarness(nats_server)
    c = nats.connector("slow", "events", steps=[{"transform": {"function": "slow:shape"}}])
    nats.prepare(c)
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    cfg = WeirConfig.model_validate({"sources": [source], "connectors": [c],
                                     "functions": {"timeout": "300ms"}})  # fmt: skip
    start = time.monotonic()
    with serving(cfg), psycopg.connect(table, autocommit=True) as conn:
        for i in range(1, 5):
            conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
        got = wait_delivered(nats, c, 3)
        wait_for(lambda: cursor_of(table, "slow")[0] == 4, what="the cursor past all four")
    assert [d.payload["id"] for d in got] == [1, 3, 4]
    assert time.monotonic() - start < 4.5  # not held up by the sleeping call
    with psycopg.connect(table) as conn:
        row = conn.execute("SELECT error FROM weir.failed_messages WHERE connector = 'slow'")
        assert [r[0] for r in row] == [
            "StepFailed: steps[0] transform: ran past functions.timeout (0.3s)"
        ]


@pytest.mark.slow
def test_steps_keep_order_and_exactly_once_across_sigkill(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """Routed to a subject a record by its steps, under load, killed twice: the read-back finds
    what the broker took wherever the route put it (the duplicate window is 100 ms)."""
    create_load_table(db_url)
    nats = NatsHarness(nats_server)
    events, records = crash_connectors(nats)
    steps = [{"transform": {"add": {"table": "{metadata.table_name}"}}},
             {"route": {"subject": "load.{record.id}"}}]  # fmt: skip
    events["steps"] = records["steps"] = steps
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [events, records]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))
    with WeirProcess(config, tmp_path / "weir.log") as weir:
        expected = load_with_interruptions(db_url, 2000, [600, 1400], weir.kill_and_restart)
        wait_all_delivered(nats, events, records, len(expected))
    got_events, got_records = nats.read(events), nats.read(records)
    check_delivered(db_url, got_events, got_records, expected)
    for stream, got in (("events", got_events), ("records", got_records)):
        ns = (events if stream == "events" else records)["nats"]["namespace"]
        assert all(d.subject == f"sequin-{stream}.{ns}.load.{d.payload['record']['id']}"
                   and d.payload["record"]["table"] == "load" for d in got)  # fmt: skip


def test_transform_test_shows_each_stored_message_beside_what_its_steps_make(
    tmp_path: Path, table: str, nats_server: EmbeddedNats
) -> None:
    nats = NatsHarness(nats_server)
    c = nats.connector("tried", "events", steps=[
        {"filter": "record.id != 2 and (record.id != 3 or record.body + 1)"},
        {"route": {"subject": "t.{record.body}"}}, {"transform": {"keep": ["id"]}}])  # fmt: skip
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({"sources": [source], "connectors": [c]}))
    nats.prepare(c)
    with serving(load_config(config)):
        insert_t(table, range(1, 4))  # 1 goes, 2 is dropped, 3 fails (text + 1)
        wait_for(lambda: cursor_of(table, "tried")[0] == 3, what="all three handled")
    assert [d.payload["record"] for d in nats.read(c)] == [{"id": 1}]
    run = subprocess.run([sys.executable, "-m", "core.cli", "transform", "test", "--config",
                          str(config), "--connector", "tried"], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    kinds = [line.split()[1 if line[0] != " " else 0] for line in lines[:-1]]
    assert kinds == ["in", "out", "in", "dropped", "in", "fails:"]
    assert lines[1].split(None, 1)[1].startswith('{"record":{"id":1},"changes":null,')
    assert lines[1].endswith("}}  (route: subject=t.x)")
    assert lines[5].endswith("steps[0] filter: TypeError: + takes numbers, not text")
    assert re.fullmatch(r"3 messages: 1 sent, 1 dropped, 1 failed; [\d.]+ us a message",
                        lines[-1])  # fmt: skip
    wrong = subprocess.run([sys.executable, "-m", "core.cli", "transform", "test", "--config",
                            str(config), "--connector", "nope"], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert wrong.returncode == 2 and "there are: tried" in wrong.stderr


def test_enrich_joins_a_row_of_the_source_to_each_message_one_query_a_batch(
    db_url: str, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing row is null; a query that fails retries the batch (never sent unenriched)
    and says why, and goes on once the query works."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, credit numeric)")
        conn.execute("INSERT INTO customers VALUES (1, 'Ada', 12345678901234567890.12)")
        conn.execute("CREATE TABLE purchases (id int PRIMARY KEY, customer_id int)")
    nats = NatsHarness(nats_server)
    enrich = {"sql": "SELECT id, name, credit FROM customers WHERE id = ANY(%(ids)s::int[])",
              "key": "record.customer_id", "into": "customer"}  # fmt: skip
    c = nats.connector("joined", "events", collections=["public:purchases"],
                       steps=[{"enrich": enrich}, {"filter": "record.customer is not None or "
                                                             "record.id != 3"}])  # fmt: skip
    nats.prepare(c)
    cfg = weir_config(db_url, [c])
    with serving(cfg), psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO purchases VALUES (1, 1), (2, 1), (3, 2), (4, NULL)")
        got = wait_delivered(nats, c, 3, settle=0.5)
        assert [(d.payload["record"]["id"], d.payload["record"]["customer"]) for d in got] == [
            (1, {"id": 1, "name": "Ada", "credit": 12345678901234567890.12}),
            (2, {"id": 1, "name": "Ada", "credit": 12345678901234567890.12}),
            (4, None),
        ]  # fmt: skip  (3's customer is missing: the filter dropped it)
        assert b'"credit":12345678901234567890.12' in got[0].raw  # every digit
        conn.execute("ALTER TABLE customers RENAME TO clients")  # the query fails from now on
        conn.execute("INSERT INTO purchases VALUES (5, 1)")
        with caplog.at_level(logging.INFO, logger="weir.engine"):
            wait_for(lambda: "retrying (StepFailed" not in caplog.text and "steps[0] enrich: the "
                     "query failed: relation \"customers\" does not exist" in caplog.text,
                     what="the connector retrying, saying why")  # fmt: skip
        assert len(nats.read(c)) == 3  # nothing sent unenriched
        conn.execute("ALTER TABLE clients RENAME TO customers")
        got = wait_delivered(nats, c, 4)
        assert got[-1].payload["record"]["customer"]["name"] == "Ada"


def test_a_consumers_steps_shape_filter_and_fail_what_workers_receive(
    table: str, functions_dir: Path
) -> None:
    """An HTTP pull consumer's steps run when a worker receives: a filter's dropped message is
    done with, a function that raises puts its message on the consumer's failed list with why
    (the next of its record is delivered), the fixed function delivers it on retry; each route
    family shows the shaped message, a flattened one as the record."""
    shaping = functions_dir / "shaping.py"
    write_module(shaping, "def shape(action, record, changes, metadata):\n"
                    "    if record['id'] == 2 and action == 'insert':\n"
                    "        raise ValueError('no twos here')\n"
                    "    return {'record': {'id': record['id'], 'loud': record['body'].upper()},\n"
                    "            'changes': changes, 'action': action}\n")  # fmt: skip
    shaped = {
        "name": "shaped",
        "stream": "events",
        "steps": [{"filter": "action != 'delete'"}, {"transform": {"function": "shaping:shape"}}],
    }
    flat = {"name": "flat", "stream": "events", "steps": [
        {"transform": {"drop": ["body"]}}, {"transform": {"flatten": True}}]}  # fmt: skip
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")  # an update's changes
    with api_serving(table, consumers=[shaped, flat]) as client:
        insert_t(table, range(1, 5))
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE t SET body = 'y' WHERE id = 2")
            conn.execute("DELETE FROM t WHERE id = 4")
        got = receive_all(client, "shaped", 4)
        seen = {(m["record"]["data"]["id"], m["record"]["action"]): m["record"]["data"]
                for m in got}  # fmt: skip
        assert seen == {
            (1, "insert"): {"id": 1, "loud": "X"}, (3, "insert"): {"id": 3, "loud": "X"},
            (4, "insert"): {"id": 4, "loud": "X"}, (2, "update"): {"id": 2, "loud": "Y"},
        }  # fmt: skip
        assert next(m for m in got if m["record"]["action"] == "update")["record"]["changes"] == {
            "body": "x"}  # fmt: skip
        entries = client.get("/v1/http-consumers/shaped/failed").json()["data"]
        assert [e["error"] for e in entries] == [
            "StepFailed: steps[1] transform: ValueError: no twos here"
        ]
        assert receive(client, "shaped") == []  # the delete was dropped, and is done with
        write_module(
            shaping,
            "def shape(action, record, changes, metadata):\n"
            "    return {'record': {'id': record['id'], 'fixed': True}}\n",
        )
        r = client.post("/v1/http-consumers/shaped/failed/retry", json={"all": True})
        assert r.json() == {"count": 1}
        again = receive_all(client, "shaped", 1)
        assert again[0]["record"]["data"] == {"id": 2, "fixed": True}
        assert client.get("/v1/http-consumers/shaped/failed").json()["data"] == []
        # The flattened message is the record in every family, with no changes.
        pulled = client.get("/api/http_pull_consumers/flat/receive?batch_size=1").json()["data"]
        assert set(pulled[0]["record"]) == {"id", "_action"} and pulled[0]["changes"] is None
        streamed = client.post("/api/sequin_streams/flat/receive", json={"batch_size": 1}).json()
        assert set(streamed["data"][0]["data"]) == {"id", "_action"}
        # Over the API: the same checks as the file's (422 naming the step).
        for steps, why in (
            ([{"route": {"subject": "x"}}], "an HTTP pull consumer takes no route step"),
            ([{"transform": {"function": "shaping:nope"}}], "no function nope"),
        ):
            r = client.post("/v1/http-consumers", json={"name": "bad", "steps": steps})
            assert r.status_code == 422 and why in r.text, r.text


def test_a_consumers_enrich_query_that_fails_holds_its_messages_back(
    table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Never received unenriched: the batch is made visible again, the log says why, and the
    next receive once the query works delivers it enriched."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO notes VALUES (1, 'first')")
    enrich = {"sql": "SELECT id, note FROM notes WHERE id = ANY(%(ids)s::int[])",
              "key": "record.id", "into": "note"}  # fmt: skip
    joined = {"name": "joined", "stream": "records", "steps": [{"enrich": enrich}]}
    with api_serving(table, consumers=[joined]) as client, \
            psycopg.connect(table, autocommit=True) as conn:  # fmt: skip
        insert_t(table, range(1, 3))
        got = receive_all(client, "joined", 2)
        assert sorted((m["record"]["data"]["id"], m["record"]["data"]["note"]) for m in got
                      ) == [(1, {"id": 1, "note": "first"}), (2, None)]  # fmt: skip
        conn.execute("ALTER TABLE notes RENAME TO memos")  # the query fails from now on
        insert_t(table, range(3, 4))
        with caplog.at_level(logging.WARNING, logger="weir.consume"):
            wait_for(lambda: receive(client, "joined") == []
                     and 'relation "notes" does not exist' in caplog.text,
                     what="a receive saying why")  # fmt: skip
        conn.execute("ALTER TABLE memos RENAME TO notes")
        conn.execute("INSERT INTO notes VALUES (3, 'third')")
        got = receive_all(client, "joined", 1)
        assert got[0]["record"]["data"]["note"] == {"id": 3, "note": "third"}


def test_transform_test_runs_a_consumers_steps(table: str, tmp_path: Path) -> None:
    """``weir transform test --consumer`` runs an HTTP pull consumer's steps (one made over the
    API: the store holds it) over its latest messages, as ``--connector`` does a connector's;
    a name that is no consumer's says which there are."""
    config = tmp_path / "weir.yaml"  # what transform test reads: the store's sources
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    config.write_text(json.dumps({"sources": [source]}))
    steps = [{"filter": "record['id'] != 2"}, {"transform": {"keep": ["id"]}}]
    with api_serving(table) as client:
        r = client.post("/v1/http-consumers", json={"name": "kept", "steps": steps,
                                                    "deliver_policy": "all"})  # fmt: skip
        assert r.status_code == 201, r.text
        insert_t(table, range(1, 4))
        receive_all(client, "kept", 2)
    cli = [sys.executable, "-m", "core.cli", "transform", "test", "--config", str(config)]
    run = subprocess.run([*cli, "--consumer", "kept"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert [line.split()[1 if line[0] != " " else 0] for line in lines[:-1]] == [
        "in", "out", "in", "dropped", "in", "out"]  # fmt: skip
    assert lines[1].split(None, 1)[1].startswith('{"record":{"id":1},')
    assert lines[-1].startswith("3 messages: 2 sent, 1 dropped, 0 failed;")
    wrong = subprocess.run([*cli, "--consumer", "nope"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "no consumer named 'nope' (there are: kept)" in wrong.stderr
