"""Findings of the Nov 29 outside try-out of steps (docs/transforms.md): filters, transforms,
routes, enrich and functions, per connector and per HTTP pull consumer, against real servers.
Each test is a promise of docs/transforms.md the try-out found broken; its docstring tells what
was seen."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg.types.json import Json

from devkit.embedded import EmbeddedKafka
from tests.connectors.kafka.harness import KafkaHarness, read_kafka
from tests.helpers import stored
from tests.helpers.api import api_serving, receive, receive_all
from tests.helpers.capture import wait_for
from tests.helpers.cli import weir
from tests.helpers.functions import write_module
from tests.helpers.weir import cursor_of, failed_messages, insert_t, serving, weir_config

ONLY_T = {"collection_id": "public:t"}


def failed(client: httpx.Client, name: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/http-consumers/{name}/failed")
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def _first(client: httpx.Client, name: str) -> list[Any]:
    """Receive until a message comes or one is on the failed list; the failed list must stay
    empty."""
    got: list[Any] = []
    wait_for(lambda: got.extend(receive(client, name)) or got or failed(client, name),
             what=f"{name}'s message received or failed")  # fmt: skip
    assert failed(client, name) == []
    return got


def _consumer(name: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "stream": "events", "filters": ONLY_T, "steps": steps}


def test_add_of_a_big_integer_fails_every_message(table: str) -> None:
    """docs/transforms.md “Transform”: ``add: {field: value}`` adds “a value as given”, and
    “Numbers stay exact”. ``add: {n: 100000000000000000000000}`` (a JSON number, a YAML int
    beyond 64 bits; config validate takes it) fails EVERY message at send time with ``steps:
    the message cannot be written as JSON: Integer exceeds 64-bit range`` (not naming the step),
    though the same number read from a json column passes through a step untouched."""
    c = _consumer("big", [{"transform": {"add": {"n": 100000000000000000000000}}}])
    with api_serving(table, consumers=[c]) as client:
        insert_t(table, range(1, 3))
        got = _first(client, "big")
        assert got[0]["record"]["data"]["n"] == 10**23


def test_a_function_returning_a_big_python_int_fails_its_message(
    table: str, functions_dir: Path
) -> None:
    """docs/transforms.md “Functions”: the values are JSON's, numbers a function returns are
    written as their digits (a Decimal's too). A function returning ``record['id'] * 10**20``
    (a plain Python int, a JSON number) fails its message with ``steps: the message cannot be
    written as JSON: Integer exceeds 64-bit range``; ``Decimal(record['id'] * 10**20)`` would
    pass."""
    write_module(functions_dir / "scale.py",
                 "def up(action, record, changes, metadata):\n"
                 "    big = record['id'] * 10**20\n"
                 "    return {'record': {'id': record['id'], 'big': big}}\n")  # fmt: skip
    c = _consumer("scaled", [{"transform": {"function": "scale:up"}}])
    with api_serving(table, consumers=[c]) as client:
        insert_t(table, range(1, 2))
        got = _first(client, "scaled")
        assert got[0]["record"]["data"]["big"] == 10**20


def test_add_of_a_whole_record_template_fails_every_message(table: str) -> None:
    """docs/transforms.md “Templates”: “In ``add``, a template that is one field alone keeps
    the field's value”. ``add: {before: "{record}"}`` (a copy of the record as it was, beside
    the changed fields) puts the record inside itself, and every message fails with ``steps:
    the message cannot be written as JSON: Recursion limit reached``."""
    c = _consumer("copy", [{"transform": {"add": {"before": "{record}"}}},
                           {"transform": {"drop": ["body"]}}])  # fmt: skip
    with api_serving(table, consumers=[c]) as client:
        insert_t(table, range(1, 2))
        got = _first(client, "copy")
        assert got[0]["record"]["data"] == {"id": 1, "before": {"id": 1, "body": "x"}}


def test_an_added_list_is_one_object_shared_by_every_message(
    table: str, functions_dir: Path
) -> None:
    """docs/transforms.md: steps run “on each message”; ``add`` adds “a value as given”. The
    value of ``add: {tags: []}`` is ONE Python list handed to every message: a later function
    step that appends to ``record['tags']`` makes the second message's tags ``[1, 2]``, the
    third's ``[1, 2, 3]``: what a subscriber gets depends on every message sent before it."""
    write_module(functions_dir / "tagging.py",
                 "def tag(action, record, changes, metadata):\n"
                 "    record['tags'].append(record['id'])\n"
                 "    return {'action': action, 'record': record}\n")  # fmt: skip
    c = _consumer("tagged", [{"transform": {"add": {"tags": []}}},
                             {"transform": {"function": "tagging:tag"}}])  # fmt: skip
    with api_serving(table, consumers=[c]) as client:
        insert_t(table, range(1, 4))
        got = receive_all(client, "tagged", 3)
    assert {m["record"]["data"]["id"]: m["record"]["data"]["tags"] for m in got} == {
        1: [1], 2: [2], 3: [3]}  # fmt: skip


def test_a_filter_compares_lists_by_json_kinds(table: str) -> None:
    """docs/transforms.md “Expressions”: comparisons go “by JSON's kinds: true is not 1
    (``record.flag == 1`` is false for ``true``)”. Inside a list that does not hold:
    ``record.tags == [1]`` keeps a row whose tags are ``[true]`` (and ``[true] < [2]`` is
    true where ``true < 2`` is an error)."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("CREATE TABLE k (id int PRIMARY KEY, tags jsonb)")
        conn.execute("INSERT INTO k VALUES (1, %s), (2, %s)", (Json([True]), Json([1])))
    c = {"name": "ones", "stream": "records", "filters": {"collection_id": "public:k"},
         "deliver_policy": "all", "steps": [{"filter": "record.tags == [1]"}]}  # fmt: skip
    with api_serving(table, consumers=[c]) as client:
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE k SET tags = tags")
        got = receive_all(client, "ones", 1)
        wait_for(lambda: client.get("/v1/http-consumers/ones").json()["info"]["num_pending"]
                 == 0, what="both handled")  # fmt: skip
        got += receive(client, "ones")
    assert [m["record"]["data"]["id"] for m in got] == [2]


def test_a_unicode_field_name_reads_that_field(table: str) -> None:
    """docs/transforms.md “Expressions”: fields are named as ``record.status``. Python folds
    identifiers to NFKC, so ``record.ﬁle == 'x'`` (with the ligature ``ﬁ``, a column named
    so) read the field ``file`` instead: the filter kept rows by another column's value. Such
    a name is refused now, naming the key to write instead, which reads that field."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute('CREATE TABLE u (id int PRIMARY KEY, "ﬁle" text, file text)')
    with api_serving(table) as client:
        c = {"name": "lig", "stream": "events", "filters": {"collection_id": "public:u"},
             "deliver_policy": "all", "steps": [{"filter": "record.ﬁle == 'x'"}]}  # fmt: skip
        r = client.post("/v1/http-consumers", json=c)
        assert r.status_code == 422 and "reads as 'file'" in r.text, r.text
        c["steps"] = [{"filter": "record['ﬁle'] == 'x'"}]
        assert client.post("/v1/http-consumers", json=c).status_code == 201
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("INSERT INTO u VALUES (1, 'x', 'no'), (2, 'no', 'x')")
        got = receive_all(client, "lig", 1)
        wait_for(lambda: client.get("/v1/http-consumers/lig").json()["info"]["num_pending"]
                 == 0, what="both handled")  # fmt: skip
        got += receive(client, "lig")
    assert [m["record"]["data"]["id"] for m in got] == [1]


# -- Kafka: a topic per tenant ----------------------------------------------------------------


def _kafka_routed(kafka_server: EmbeddedKafka, name: str, route: dict[str, str],
                  made: list[str]) -> dict[str, Any]:  # fmt: skip
    """A Kafka connector on ``t`` whose topic is ``BASE.{route}`` (``{route}`` alone when
    ``made`` is empty), with ``route``; the topics ``BASE.<m>`` for each of ``made`` exist and
    no other is made (librdkafka gives up on an unknown topic within 0.3 s)."""
    c = KafkaHarness(kafka_server).connector(name, "events")
    base = c["kafka"]["topic"]
    c["kafka"]["topic"] = base + ".{route}"
    c["kafka"]["librdkafka"] = {"topic.metadata.propagation.max.ms": 300}
    c["retry"] = {"initial": "50ms", "max": "100ms", "max_attempts": 3}
    c["steps"] = [{"route": route}]
    admin = AdminClient({"bootstrap.servers": kafka_server.bootstrap})
    topics = [f"{base}.{m}" for m in made]
    for f in admin.create_topics([NewTopic(t, num_partitions=1) for t in topics]).values():
        f.result(timeout=30)
    c["_topics"] = topics
    return c


def test_kafka_routed_key_and_a_missing_topic_fail_that_message_alone(
    kafka_server: EmbeddedKafka, table: str
) -> None:
    """docs/transforms.md “Route”: a Kafka route may give ``topic`` (a topic per tenant) and
    ``key``; the topics must exist, and a message that cannot be sent goes to the failed list
    while the connector goes on. With ``route: {topic: "{record.body}", key: "{record.body}"}``
    and a row whose tenant has no topic, the broker's UNKNOWN_TOPIC report names the message by
    its Kafka key (the routed key), which KafkaSink.write_batch looks up among the batch's
    GROUP keys: ``KeyError: b'ghost'`` escapes, the session ends and starts over, again and
    again: the row never reaches the failed list and the rows after it are never sent."""
    c = _kafka_routed(kafka_server, "tenants", {"topic": "{record.body}", "key": "{record.body}"},
                      ["acme"])  # fmt: skip
    topics = c.pop("_topics")
    with serving(weir_config(table, [c])):
        insert_t(table, range(1, 2), body="acme")
        insert_t(table, range(2, 3), body="ghost")
        insert_t(table, range(3, 4), body="acme")
        wait_for(lambda: cursor_of(table, "tenants")[0] >= 3, timeout=30,
                 what="the three rows handled (the ghost's failed)")  # fmt: skip
        errors = [e["error"] for e in failed_messages(table, "tenants")]
    got = read_kafka({"bootstrap.servers": kafka_server.bootstrap}, topics, 1)
    assert sorted(d.payload["record"]["id"] for d in got) == [1, 3]
    assert len(errors) == 1 and "KeyError" not in errors[0], errors
    assert "UNKNOWN_TOPIC" in errors[0].upper(), errors


# -- weir transform test ---------------------------------------------------------------------


def _stored_rows(table: str, bodies: list[str]) -> None:
    """Rows of ``t`` with these bodies, captured into the store (Weir run without connectors)."""
    with serving(weir_config(table, [])):
        with psycopg.connect(table, autocommit=True) as conn:
            for i, body in enumerate(bodies, 1):
                conn.execute("INSERT INTO t VALUES (%s, %s)", (i, body))
        wait_for(lambda: len(stored.events(table)) >= len(bodies), what="the rows stored")


def test_transform_test_fails_a_message_the_connector_cannot_place(
    table: str, tmp_path: Path
) -> None:
    """docs/transforms.md “Trying steps”: ``weir transform test`` prints what the steps make of
    each message (“the payload and route, dropped, or fails: and why”). For a Kafka connector
    with ``topic: "orders.{route}"`` and a route function that gives no topic for a row (the
    connector puts that message on the failed list: “its route gives no topic for {route} in
    'orders.{route}'”), transform test prints it as ``out`` with no route and counts it as
    sent: ``2 messages: 2 sent, 0 dropped, 0 failed``."""
    _stored_rows(table, ["acme", "none"])
    fns = tmp_path / "functions"
    fns.mkdir()
    write_module(fns / "tenants.py", "def topic(action, record, changes, metadata):\n"
                 "    body = record['body']\n"
                 "    return {} if body == 'none' else {'topic': body}\n")  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({
        "functions": {"dir": "functions"},
        "sources": [{"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}],
        "connectors": [{"name": "tenants", "type": "kafka", "stream": "events",
                        "kafka": {"bootstrap_servers": "127.0.0.1:9", "topic": "orders.{route}"},
                        "steps": [{"route": {"function": "tenants:topic"}}]}],
    }))  # fmt: skip
    out = weir("transform", "test", "--config", str(config), "--connector", "tenants")
    assert "2 messages: 1 sent, 0 dropped, 1 failed" in out, out
    assert "its route gives no topic" in out, out


def test_transform_test_limit_zero_takes_no_message(table: str, tmp_path: Path) -> None:
    """docs/transforms.md “Trying steps”: ``--limit`` is how many of the latest messages of each
    source run. ``--limit 0`` runs EVERY stored message of the source (``got[-0:]``), up to
    100,000 of them, and ``--limit -1`` all but the first; neither is refused."""
    _stored_rows(table, ["a", "b", "c"])
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({
        "sources": [{"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}],
        "connectors": [{"name": "c", "type": "nats", "stream": "events",
                        "steps": [{"filter": "True"}]}],
    }))  # fmt: skip
    for limit in ("0", "-1"):
        out = weir("transform", "test", "--config", str(config), "--connector", "c", "--limit",
                   limit, code=2)  # fmt: skip
        assert "--limit: must be a whole number of 1 or more" in out, out


# -- HTTP pull consumers: steps that outrun the hiding ----------------------------------------


_STALE = """import os, time
FLAG = {flag!r}
def _same(action, record, changes, metadata):
    return {{"action": action, "record": record, "changes": changes, "metadata": metadata}}
def one(action, record, changes, metadata):
    if not os.path.exists(FLAG):
        time.sleep(0.8)
        record["slow"] = True
    return _same(action, record, changes, metadata)
def two(action, record, changes, metadata):
    if record.get("slow"):
        time.sleep(0.8)
    return _same(action, record, changes, metadata)
def three(action, record, changes, metadata):
    if record.get("slow"):
        raise ValueError("the stale receive's steps fail")
    return _same(action, record, changes, metadata)
"""


def test_a_stale_receives_failing_steps_do_not_fail_a_message_another_worker_acked(
    table: str, functions_dir: Path
) -> None:
    """docs/transforms.md “Consumers”: one worker gets each delivery. Steps ``[function,
    enrich, function, enrich, function]`` ran each function segment under its own
    ``functions.timeout``, so one message's steps took 1.6 s while it was hidden 1.1 s
    (ack_wait_ms 100, timeout 1 s, batch 1): receive B took the message meanwhile, its worker
    acked it, then receive A's stale steps failed and their failure was applied anyway (the
    acked message on the failed list; a retry sent it again). Now a receive's messages are
    hidden for as long as all its steps may take, and a failure counts only for the delivery
    it was made for: B gets nothing while A's steps run, A's failure puts the message on the
    failed list once, and its retry delivers it once."""
    flag = functions_dir / "fast"
    write_module(functions_dir / "stale.py", _STALE.format(flag=str(flag)))
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("CREATE TABLE c (id int PRIMARY KEY)")
    enrich = {"enrich": {"sql": "SELECT id FROM c WHERE id = ANY(%(ids)s::int[])",
                         "key": "record.id", "into": "c"}}  # fmt: skip
    c = {"name": "stale", "stream": "events", "filters": ONLY_T, "ack_wait_ms": 100,
         "steps": [{"transform": {"function": "stale:one"}}, enrich,
                   {"transform": {"function": "stale:two"}}, enrich,
                   {"transform": {"function": "stale:three"}}]}  # fmt: skip
    with api_serving(table, consumers=[c], functions={"timeout": "1s"}) as client:
        insert_t(table, range(1, 2))
        wait_for(lambda: client.get("/v1/http-consumers/stale").json()["info"]["num_pending"]
                 == 1, what="the message queued")  # fmt: skip
        first: list[Any] = []
        a = threading.Thread(target=lambda: first.extend(receive(client, "stale", 1)))
        a.start()
        time.sleep(0.2)
        flag.write_text("")  # from now on the functions are quick
        time.sleep(1.1)  # past 100 ms + one timeout; A's steps still run
        assert receive(client, "stale", 1) == []  # hidden while A's steps may run
        a.join(30)
        assert first == []
        assert len(failed(client, "stale")) == 1  # A's steps failed: its delivery, once
        r = client.post("/v1/http-consumers/stale/failed/retry", json={"all": True})
        assert r.json() == {"count": 1}
        again = receive_all(client, "stale", 1)  # quick now: made, and delivered
        assert [m["record"]["data"]["id"] for m in again] == [1]
