"""Findings of a second Nov 29 outside try-out of steps (docs/transforms.md), against real
servers (PostgreSQL, nats-server, the webhook receiver, the HTTP pull API). Each test is one
promise of docs/transforms.md the try-out found broken on the current code; its docstring quotes
the promise and tells what was seen. (The findings of test_tryout_steps_nov29.py are not
repeated.)"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers import stored
from tests.helpers.api import all_handled, api_serving
from tests.helpers.capture import wait_for
from tests.helpers.cli import weir
from tests.helpers.functions import write_module
from tests.helpers.weir import cursor_of, failed_messages, insert_t, serving, weir_config

ONLY_J = {"collection_id": "public:j"}
BIG = 123456789012345678901234567890  # 30 digits: beyond a double's 17


def _jtable(url: str) -> None:
    """``j (id, cust, doc jsonb, raw json)``: json columns pass through as their own text."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE j (id int PRIMARY KEY, cust int, doc jsonb, raw json)")


def _insert_j(url: str, *rows: tuple[int, int | None, str, str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for row in rows:
            conn.execute("INSERT INTO j VALUES (%s, %s, %s, %s)", row)


# -- Numbers stay exact -----------------------------------------------------------------------


def test_a_filter_alone_reads_a_30_digit_json_number_rounded(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “numbers compare by value however they were written”,
    and “Numbers stay exact. The payload is read with every number as written (a numeric in a
    json column with 30 digits …)”. A jsonb ``{"n": 123456789012345678901234567890}`` and
    ``filter: 'record.doc.n == 123456789012345678901234567890'``: when the steps are that filter
    alone, the row is DROPPED (the payload is read by orjson, which makes the 30 digits the float
    1.2345678901234568e+29); put ``transform: {drop: [x]}`` (a no-op) before the same filter and
    the row is kept. What a filter decides depends on whether another step rewrites the
    payload."""
    _jtable(db_url)
    flt = {"filter": f"record.doc.n == {BIG}"}
    cs = [{"name": "alone", "stream": "events", "filters": ONLY_J, "steps": [flt]},
          {"name": "after", "stream": "events", "filters": ONLY_J,
           "steps": [{"transform": {"drop": ["x"]}}, flt]}]  # fmt: skip
    with api_serving(db_url, consumers=cs) as client:
        _insert_j(db_url, (1, None, json.dumps({"n": BIG}), "{}"))
        after, after_failed = all_handled(client, "after")
        alone, alone_failed = all_handled(client, "alone")
    assert [m["record"]["data"]["id"] for m in after] == [1] and after_failed == []
    assert [m["record"]["data"]["id"] for m in alone] == [1], alone_failed


def test_a_route_alone_writes_a_30_digit_json_number_as_a_rounded_float(
    nats_server: EmbeddedNats, db_url: str
) -> None:
    """docs/transforms.md “Templates”/“Route”: in a route “a value is written as a subject
    token”, a number as JSON writes it (``str``: “a number as JSON writes it”), and “Numbers stay
    exact”. A NATS connector with ``route: {subject: "t.{record.doc.n}"}`` (no transform) and a
    jsonb ``{"n": 123456789012345678901234567890}`` publishes to
    ``…t.1%2E2345678901234568e%2B29`` (the rounded float's text), not ``…t.1234…7890``: a
    subscriber of the tenant's subject never gets it. (Same cause as the filter above: steps that
    do not rewrite the payload read it with orjson's rounding.)"""
    _jtable(db_url)
    h = NatsHarness(nats_server)
    c = h.connector("bigroute", "events", collections=["public:j"],
                    steps=[{"route": {"subject": "t.{record.doc.n}"}}])  # fmt: skip
    h.prepare(c)
    with serving(weir_config(db_url, [c])):
        _insert_j(db_url, (1, None, json.dumps({"n": BIG}), "{}"))
        wait_for(lambda: cursor_of(db_url, "bigroute")[0] >= 1, timeout=30, what="the row sent")
    got = h.read(c)
    assert len(got) == 1, failed_messages(db_url, "bigroute")
    assert got[0].subject.endswith(f".t.{BIG}"), got[0].subject


def test_json_numbers_with_many_digits_compare_as_doubles(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “numbers compare by value however they were written”;
    “Numbers stay exact”. A jsonb ``{"a": 12345678901234567890.10, "b": 12345678901234567890.20}``
    (two amounts that differ) and ``filter: 'record.doc.a != record.doc.b'``: the row is DROPPED,
    as ``a`` and ``b`` are both read as the double 1.2345678901234567e+19 and are “equal”; so too
    ``record.doc.a < record.doc.b`` is false, and a jsonb ``0.000…001`` (``1e-400``) is not
    ``> 0``. A transform before the filter changes nothing: exact numbers compare as floats."""
    _jtable(db_url)
    doc = '{"a": 12345678901234567890.10, "b": 12345678901234567890.20, "tiny": 1e-400}'
    cs = [{"name": "differ", "stream": "events", "filters": ONLY_J,
           "steps": [{"transform": {"drop": ["x"]}}, {"filter": "record.doc.a != record.doc.b"}]},
          {"name": "less", "stream": "events", "filters": ONLY_J,
           "steps": [{"filter": "record.doc.a < record.doc.b"}]},
          {"name": "tiny", "stream": "events", "filters": ONLY_J,
           "steps": [{"filter": "record.doc.tiny > 0"}]}]  # fmt: skip
    with api_serving(db_url, consumers=cs) as client:
        _insert_j(db_url, (1, None, doc, "{}"))
        seen = {name: all_handled(client, name) for name in ("differ", "less", "tiny")}
    kept = {name: [m["record"]["data"]["id"] for m in got] for name, (got, _) in seen.items()}
    assert kept == {"differ": [1], "less": [1], "tiny": [1]}, seen


def test_minus_zero_in_a_json_column_loses_its_sign(nats_server: EmbeddedNats, db_url: str) -> None:
    """docs/transforms.md “What steps keep”: “The payload is read with every number as written
    … and written back so”. A ``json`` column ``{"v": -0, "w": 1.10}`` (json keeps its text) through
    ``transform: {drop: [nothing]}`` reaches the NATS subscriber as ``{"v":0,"w":1.10}``: ``1.10``
    stays as written, ``-0`` is written back as ``0`` (read as the int 0, which has no sign).
    Without the step the subscriber gets ``-0``."""
    _jtable(db_url)
    h = NatsHarness(nats_server)
    c = h.connector("negzero", "events", collections=["public:j"],
                    steps=[{"transform": {"drop": ["nothing"]}}])  # fmt: skip
    h.prepare(c)
    with serving(weir_config(db_url, [c])):
        _insert_j(db_url, (1, None, "{}", '{"v": -0, "w": 1.10}'))
        wait_for(lambda: cursor_of(db_url, "negzero")[0] >= 1, timeout=30, what="the row sent")
    got = h.read(c)
    assert len(got) == 1, failed_messages(db_url, "negzero")
    assert b'"w":1.10' in got[0].raw, got[0].raw  # as written: held
    assert b'"v":-0' in got[0].raw, got[0].raw


# -- Enrich -----------------------------------------------------------------------------------


def test_an_enriched_row_is_one_object_shared_by_the_messages_of_its_key(
    db_url: str, functions_dir: Path
) -> None:
    """docs/transforms.md: steps run “on each message”; “enrich … into: the record's field the
    row goes in: an object of the row's columns”; “Steps after an enrich step see the row”. Two
    orders of customer 7 in one batch get the SAME dict as ``record['customer']``: a function
    after the enrich that redacts it (``record['customer'].pop('secret')``, as one does with a
    joined row) works for the first order, and the second fails with ``StepFailed: steps[1]
    transform: KeyError: 'secret'`` (what the first message's function did to its row shows in
    the next message). The earlier tryout's shared ``add: {tags: []}`` was fixed by a copy; the
    enrich's row is not copied."""
    _jtable(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE cust (id int PRIMARY KEY, name text, secret text)")
        conn.execute("INSERT INTO cust VALUES (7, 'ann', 'pin-1234')")
    write_module(functions_dir / "redact.py",
                 "def secret(action, record, changes, metadata):\n"
                 "    record['customer'].pop('secret')\n"
                 "    return {'action': action, 'record': record}\n")  # fmt: skip
    c = {"name": "orders", "stream": "events", "filters": ONLY_J, "steps": [
        {"enrich": {"sql": "SELECT id, name, secret FROM cust WHERE id = ANY(%(ids)s::int[])",
                    "key": "record.cust", "into": "customer"}},
        {"transform": {"function": "redact:secret"}}]}  # fmt: skip
    with api_serving(db_url, consumers=[c]) as client:
        _insert_j(db_url, (1, 7, "{}", "{}"), (2, 7, "{}", "{}"))  # one transaction: one batch
        got, failed = all_handled(client, "orders")
    assert [f.get("error") for f in failed] == [], failed
    assert sorted(m["record"]["data"]["id"] for m in got) == [1, 2]
    assert all(m["record"]["data"]["customer"] == {"id": 7, "name": "ann"} for m in got), got


# -- Exactly once: the webhook's idempotency key ------------------------------------------------


def test_a_webhook_message_flattened_has_no_idempotency_key(
    webhook_receiver: Receiver, table: str
) -> None:
    """docs/transforms.md “What steps keep”: “the idempotency key (``Nats-Msg-Id``, the Kafka key,
    the webhook's ``metadata.idempotency_key`` as stored) are made before any step … A step
    changes the payload and the route only, so per-record order and de-duplication hold whatever
    it does.” A webhook connector with ``transform: {flatten: true}`` (the documented
    ExtractNewRecordState shape) POSTs ``{"data":[{"id":1,"body":"x","_action":"insert"}]}``:
    no ``metadata.idempotency_key`` in the body, and no header carrying it either, so a webhook
    receiver (at-least-once: it “dedupes repeats by metadata.idempotency_key”, docs/design.md)
    cannot tell a resend from a new change. The key the docs say is “made before any step” is
    gone with the step. Now each request carries its messages' keys beside them
    (``idempotency_keys``), whatever the steps made of the payloads."""
    h = WebhookHarness(webhook_receiver)
    c = h.connector("flat", "events", steps=[{"transform": {"flatten": True}}])
    h.prepare(c)
    bodies: list[bytes] = []
    handle = webhook_receiver.handle

    def keep_body(path: str, headers: dict[str, str], body: bytes) -> int:
        bodies.append(body)
        return handle(path, headers, body)

    webhook_receiver.handle = keep_body  # type: ignore[method-assign]
    try:
        with serving(weir_config(table, [c])):
            insert_t(table, range(1, 3))
            wait_for(lambda: cursor_of(table, "flat")[0] >= 2, timeout=30, what="the rows sent")
    finally:
        webhook_receiver.handle = handle  # type: ignore[method-assign]
    sent = [json.loads(b) for b in bodies]
    pairs = [(m["id"], k) for b in sent for m, k in zip(b["data"], b["idempotency_keys"],
                                                          strict=True)]  # fmt: skip
    keys = {e["record_id"]: f"{e['sync_id']}:{e['commit_lsn']}:{e['commit_idx']}"
            for e in stored.events(table)}  # as the payload's metadata says  # fmt: skip
    assert sorted(pairs) == [(1, keys["1"]), (2, keys["2"])], sent


# -- Config errors name the step ---------------------------------------------------------------


def test_a_route_steps_config_error_does_not_name_the_step(db_url: str, tmp_path: Path) -> None:
    """docs/transforms.md: “``weir config validate`` checks every expression, template and
    function at load (``file:line: connectors[0].steps[1]…: why``, exit 2), and the management
    API answers 422 with the same sentence.” A route whose literal text is no subject
    (``route: {subject: "a..b"}`` as the connector's second step): validate exits 2 with
    ``weir.yaml:N: connectors[0]: steps: route subject 'a..b': …`` — the line of the connector,
    the key ``connectors[0]``, and no step index; the API's 422 puts it at ``loc: [body, nats]``
    (the ``nats:`` settings, not the step). A filter's error is named as promised
    (``connectors[0].steps[1].filter``)."""
    config = tmp_path / "weir.yaml"
    config.write_text(
        "sources:\n"
        f"  - {{name: app, kind: postgres, url: '{db_url}', schemas: [public]}}\n"
        "connectors:\n"
        "  - name: c\n"
        "    type: nats\n"
        "    stream: events\n"
        "    steps:\n"
        "      - filter: 'True'\n"
        "      - route: {subject: 'a..b'}\n"  # line 9
    )
    out = weir("config", "validate", "--config", str(config), code=2)
    assert "weir.yaml:9: connectors[0].steps[1]" in out, out
    step = {"route": {"subject": "a..b"}}
    with api_serving(db_url) as client:
        r = client.post("/v1/connectors", json={"name": "c", "type": "nats", "stream": "events",
                                                "steps": [{"filter": "True"}, step]})  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:3] == ["body", "steps", 1], r.text
