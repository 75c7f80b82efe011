"""An HTTP pull consumer's ``steps:`` (filter, transform, enrich) as an outside user meets them
(docs/transforms.md “Consumers”, docs/consume-api.md): what workers receive in each route
family against what the table holds, a record's order with dropped and failed messages between,
``max_ack_pending``, long polls, the failed list and its retry, enrich queries that fail, the
management API and ``weir config validate``, restarts. Real servers throughout.
"""

from __future__ import annotations

import logging
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Json

from devkit.server import free_port
from tests.helpers.api import TOKEN, api_config, api_serving, receive, receive_all, settle
from tests.helpers.capture import wait_for
from tests.helpers.functions import write_module
from tests.helpers.weir import Running, insert_t

ONLY_T = {"collection_id": "public:t"}  # not the helper tables a test makes


def failed(client: httpx.Client, name: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/http-consumers/{name}/failed")
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def ids_of(batch: list[Any]) -> list[int]:
    return [int(m["record"]["resource_id"]) for m in batch]


def _notes(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO notes VALUES (1, 'first')")


ENRICH = {"sql": "SELECT id, note FROM notes WHERE id = ANY(%(ids)s::int[])", "key": "record.id",
          "into": "note"}  # fmt: skip

# -- enrich ----------------------------------------------------------------------------------


def test_a_failed_enrich_query_holds_the_batch_back_instead_of_failing_it(
    table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/transforms.md “Consumers”: an enrich query that fails makes the batch visible again
    and the receive answers without them. It put each message of the batch on the failed list at
    once ('RetryableError: steps[0] enrich: the query failed'), so a table renamed for a second
    sent every change received meanwhile to the failed list, for an operator to retry by hand
    (the integration test passed on the enrich table's own insert)."""
    _notes(table)
    joined = {"name": "joined", "stream": "records", "filters": ONLY_T,
              "steps": [{"enrich": ENRICH}]}  # fmt: skip
    with api_serving(table, consumers=[joined]) as client, \
            psycopg.connect(table, autocommit=True) as conn:  # fmt: skip
        conn.execute("ALTER TABLE notes RENAME TO memos")
        insert_t(table, range(1, 3))
        with caplog.at_level(logging.WARNING, logger="weir.consume"):
            wait_for(lambda: receive(client, "joined") == []
                     and 'relation "notes" does not exist' in caplog.text,
                     what="a receive saying why")  # fmt: skip
        assert failed(client, "joined") == []
        conn.execute("ALTER TABLE memos RENAME TO notes")
        got = receive_all(client, "joined", 2)
        assert sorted((m["record"]["data"]["id"], m["record"]["data"]["note"]) for m in got) == [
            (1, {"id": 1, "note": "first"}), (2, None)]  # fmt: skip
        assert failed(client, "joined") == []


def test_one_long_poll_during_an_enrich_outage_does_not_use_up_max_deliver(table: str) -> None:
    """A worker makes ONE long poll (3 s) while the enrich query fails (a table renamed, the
    source restarting). The receive retries the query every 0.25 s, each retry a delivery, so
    with max_deliver 3 the messages are on the failed list when that one call returns, with
    'not acknowledged after 3 deliveries (max_deliver)': no worker ever saw them, and the
    reason does not say the enrich query failed."""
    _notes(table)
    joined = {"name": "joined", "stream": "records", "filters": ONLY_T, "max_deliver": 3,
              "steps": [{"enrich": ENRICH}]}  # fmt: skip
    with api_serving(table, consumers=[joined]) as client, \
            psycopg.connect(table, autocommit=True) as conn:  # fmt: skip
        conn.execute("ALTER TABLE notes RENAME TO memos")
        insert_t(table, range(1, 3))
        wait_for(lambda: client.get("/v1/http-consumers/joined").json()["info"]["num_pending"]
                 == 2, what="two messages queued")  # fmt: skip
        assert receive(client, "joined", wait_for=3000) == []
        entries = failed(client, "joined")
        assert all("enrich" in e["error"] for e in entries), entries
        assert entries == [], "one receive call put them on the failed list"


# -- filters against the table: generated rows and expressions -------------------------------

STATUSES = ["paid", "refunded", "open", None]
TOTALS = [None, "0", "9.99", "1.10", "100", "-5.5"]  # JSON numbers in a jsonb column
LITERALS = ["0", "9.99", "1.1", "100", "-5.5"]
SENTINEL = 999_999  # inserted last, kept by every filter: all before it were queued


class Fails(Exception):
    """The filter errs on this row: the message goes to the failed list."""


Row = dict[str, Any]
Atom = tuple[str, Any]  # (expression text, oracle of a row: True/False, or raises Fails)


def _num_atom(op: str, lit: str) -> Atom:
    def oracle(r: Row) -> bool:
        t = r["total"]
        if t is None:
            return op == "!="  # == null is false, ordering with null is false
        a, b = Decimal(t), Decimal(lit)
        return {"<": a < b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[op]

    return f"record.total {op} {lit}", oracle


def _status_atom(kind: str, value: Any) -> Atom:
    if kind == "eq":
        return f"record.status == {value!r}", lambda r: r["status"] == value
    if kind == "in":
        return f"record.status in {value!r}", lambda r: r["status"] in value
    if kind == "none":
        return "record.status is None", lambda r: r["status"] is None

    def across(r: Row) -> bool:  # text with a number: an error; null: false
        if r["status"] is None:
            return False
        raise Fails

    return "record.status > 5", across


def _flag_atom(kind: str) -> Atom:
    if kind == "true":
        return "record.flag == True", lambda r: r["flag"] is True
    if kind == "one":  # JSON's kinds: true is not 1
        return "record.flag == 1", lambda r: False
    return "record.flag is not None", lambda r: r["flag"] is not None


def _tag_atom(tag: str) -> Atom:
    return f"{tag!r} in record.tags", lambda r: r["tags"] is not None and tag in r["tags"]


atoms = st.one_of(
    st.builds(_num_atom, st.sampled_from(["<", ">", ">=", "==", "!="]), st.sampled_from(LITERALS)),
    st.builds(_status_atom, st.just("eq"), st.sampled_from(["paid", "open"])),
    st.builds(_status_atom, st.just("in"), st.just(["paid", "refunded"])),
    st.builds(_status_atom, st.sampled_from(["none", "across"]), st.none()),
    st.builds(_flag_atom, st.sampled_from(["true", "one", "set"])),
    st.builds(_tag_atom, st.sampled_from(["a", "b"])),
)


def _and(x: Atom, y: Atom) -> Atom:
    return f"({x[0]}) and ({y[0]})", lambda r: x[1](r) and y[1](r)


def _or(x: Atom, y: Atom) -> Atom:
    return f"({x[0]}) or ({y[0]})", lambda r: x[1](r) or y[1](r)


def _not(x: Atom) -> Atom:
    return f"not ({x[0]})", lambda r: not x[1](r)


filters = st.recursive(
    atoms,
    lambda inner: st.one_of(
        st.builds(_and, inner, inner), st.builds(_or, inner, inner), st.builds(_not, inner)
    ),
    max_leaves=4,
)
rows = st.lists(
    st.fixed_dictionaries({
        "status": st.sampled_from(STATUSES),
        "total": st.sampled_from(TOTALS),
        "flag": st.sampled_from([True, False, None]),
        "tags": st.one_of(st.none(), st.lists(st.sampled_from(["a", "b", "c"]), max_size=2)),
    }),
    min_size=1,
    max_size=8,
)  # fmt: skip
FAMILIES = {  # receive path, ack path, ack field, (item -> (token, row id))
    "v1": ("/v1/http-consumers/{}/next", "/v1/http-consumers/{}/ack", "ack_tokens",
           lambda m: (m["ack_token"], m["record"]["data"]["id"])),
    "pull": ("/api/http_pull_consumers/{}/receive", "/api/http_pull_consumers/{}/ack",
             "ack_tokens", lambda m: (m["ack_token"], m["record"]["id"])),
    "streams": ("/api/sequin_streams/{}/receive", "/api/sequin_streams/{}/ack", "ack_ids",
                lambda m: (m["ack_id"], m["data"]["record"]["id"])),
}  # fmt: skip


def _drain(client: httpx.Client, family: str, name: str) -> list[int]:
    """Receive and ack until the sentinel came and a long poll finds nothing more."""
    recv, ack, field, item = FAMILIES[family]
    got: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = client.get(recv.format(name), params={"batch_size": 100, "wait_for": 1200})
        assert r.status_code == 200, r.text
        batch = [item(m) for m in r.json()["data"]]
        if batch:
            body = {field: [t for t, _ in batch]}
            assert client.post(ack.format(name), json=body).json()["count"] == len(batch)
            got += [int(i) for _, i in batch]
        elif SENTINEL in got:
            return got
    raise AssertionError(f"{name}: the sentinel never came ({got})")


_made = iter(range(10**6))


def test_workers_receive_what_the_filter_keeps_of_the_table(db_url: str) -> None:
    """Generated rows and filter expressions (docs/transforms.md “Expressions”): each route
    family gives a worker exactly the rows the filter keeps, once each; the rows it errs on
    (text compared with a number) are on the consumer's failed list, each with the reason,
    and the rest of the table is not held back by them."""

    @given(table=rows, flt=filters, family=st.sampled_from(sorted(FAMILIES)))
    @settings(max_examples=8, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(table: list[Row], flt: Atom, family: str) -> None:
        n = next(_made)
        name = f"gen{n}"
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE g{n} (id int PRIMARY KEY, status text, total jsonb,"
                         " flag boolean, tags jsonb)")  # fmt: skip
            body = {"name": name, "filters": {"collection_id": f"public:g{n}"},
                    "steps": [{"filter": f"record.id == {SENTINEL} or ({flt[0]})"}]}  # fmt: skip
            r = served.post("/v1/http-consumers", json=body)
            assert r.status_code == 201, r.text
            for i, row in enumerate(table):  # a numeric column is text in a message
                conn.execute(f"INSERT INTO g{n} VALUES (%s, %s, %s::jsonb, %s, %s)",
                             (i, row["status"], row["total"], row["flag"],
                              None if row["tags"] is None else Json(row["tags"])))  # fmt: skip
            conn.execute(f"INSERT INTO g{n} (id) VALUES ({SENTINEL})")
        kept, erring = set(), set()
        for i, row in enumerate(table):
            try:
                if flt[1](row):
                    kept.add(i)
            except Fails:
                erring.add(i)
        try:
            got = _drain(served, family, name)
            assert sorted(got) == sorted([*kept, SENTINEL]), (flt[0], family, table)
            entries = failed(served, name)
            listed = set()
            for e in entries:
                one = served.get(f"/v1/http-consumers/{name}/failed/{e['id']}").json()
                listed.add(one["message"]["record"]["id"])
                assert e["error"].startswith("StepFailed: steps[0] filter: TypeError: "), e
            assert listed == erring, (flt[0], table)
        finally:  # each served consumer holds store connections
            served.delete(f"/v1/http-consumers/{name}")

    with api_serving(db_url) as served:
        check()


# -- functions --------------------------------------------------------------------------------


ODD = """import decimal
def f(action, record, changes, metadata):
    i = record['id']
    if action != 'insert': return {'record': record, 'changes': changes}
    if i == 1: return None
    if i == 2: return [1]
    if i == 3: return {'record': {1: 'x'}}
    if i == 4: return {'record': {'n': decimal.Decimal('NaN')}}
    if i == 5: return {'record': {'n': float('nan'), 'd': decimal.Decimal('1.10')}}
    if i == 6:
        x = {}
        for _ in range(300): x = {'a': x}
        return {'record': x}
    if i == 7: return {'record': None}
    if i == 8: raise RuntimeError('cannot use test-token-0123456789 here')
    if i == 9: return {'record': {'s': {1, 2}}}
    return {'record': record, 'changes': changes}
"""


def test_what_a_function_returns_decides_delivery_in_every_family(
    table: str, functions_dir: Path
) -> None:
    """docs/transforms.md “Functions”: None drops (done with), a non-dict, a key that is not
    text, Decimal NaN, a set or nesting beyond JSON's depth fails (the failed list says why,
    the API token masked); a float NaN is null and a Decimal its digits; the record's next
    change still comes."""
    write_module(functions_dir / "odd.py", ODD)
    c = {"name": "odd", "steps": [{"transform": {"function": "odd:f"}}]}
    with api_serving(table, consumers=[c]) as client:
        insert_t(table, range(1, 11))
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE t SET body = 'later' WHERE id < 11")
        got = receive_all(client, "odd", 13)
        first = {int(m["record"]["resource_id"]): m["record"]["data"] for m in got
                 if m["record"]["action"] == "insert"}  # fmt: skip
        assert first == {5: {"n": None, "d": 1.10}, 7: None, 10: {"id": 10, "body": "x"}}
        updates = [m["record"]["data"] for m in got if m["record"]["action"] == "update"]
        assert sorted(u["id"] for u in updates) == list(range(1, 11))  # not held back
        assert receive(client, "odd", wait_for=500) == []
        errors = {e["seq"]: e["error"] for e in failed(client, "odd")}
        assert len(errors) == 6, errors  # the inserts of ids 2, 3, 4, 6, 8, 9
        text = "\n".join(errors.values())
        for why in (
            "returned list, not a dict or None",
            "Dict key must be str",
            "Recursion limit reached",
            "RuntimeError: cannot use *** here",
            "set",
        ):
            assert why in text, text  # fmt: skip
        assert "test-token-0123456789" not in text


def test_a_records_changes_come_in_order_past_dropped_and_failed_ones(
    table: str, functions_dir: Path
) -> None:
    """Per record (and per ``group_columns`` group) one message is outstanding at a time and
    they come in order; a change the filter drops or the function fails does not block the
    record's next one, and is never delivered. max_ack_pending 2 still caps what is out."""
    write_module(functions_dir / "pick.py", "def f(action, record, changes, metadata):\n"
           "    if record['body'] == 'v3':\n        raise ValueError('no v3')\n"
           "    return {'record': record, 'changes': changes, 'action': action}\n")  # fmt: skip
    steps = [{"filter": "record.body != 'v2'"}, {"transform": {"function": "pick:f"}}]
    by_id = {"name": "by_id", "max_ack_pending": 2, "steps": steps}
    by_body = {"name": "by_body", "group_columns": ["body"], "steps": steps}
    with api_serving(table, consumers=[by_id, by_body]) as client:
        insert_t(table, range(1, 5), body="v0")
        with psycopg.connect(table, autocommit=True) as conn:
            for v in range(1, 6):
                conn.execute("UPDATE t SET body = %s", (f"v{v}",))
        seen: dict[str, list[tuple[int, str]]] = {}
        deadline = time.monotonic() + 60
        while sum(map(len, seen.values())) < 16 and time.monotonic() < deadline:
            batch = receive(client, "by_id", 10, wait_for=500)
            assert len(batch) <= 2  # max_ack_pending
            records = [m["record"]["resource_id"] for m in batch]
            assert len(records) == len(set(records)), "two of a record out at once"
            for m in batch:
                seen.setdefault(m["record"]["resource_id"], []).append(
                    (int(m["record"]["seq"]), m["record"]["data"]["body"])
                )
            settle(client, "by_id", batch)
        for rid, got in seen.items():
            assert [b for _, b in got] == ["v0", "v1", "v4", "v5"], (rid, got)
            assert got == sorted(got)
        assert len(failed(client, "by_id")) == 4  # each record's v3
        groups = receive(client, "by_body", 100)  # one group per body: its first message
        assert sorted(m["record"]["data"]["body"] for m in groups) == ["v0", "v1", "v4", "v5"]
        assert all(m["record"]["resource_id"] == "1" for m in groups)


# -- a consumer made over the API whose function goes away ------------------------------------


def _made_over_the_api(client: httpx.Client, functions_dir: Path) -> None:
    """A consumer ``api`` made over the API, its step calling ``shaping:f``."""
    write_module(functions_dir / "shaping.py", "def f(action, record, changes, metadata):\n"
                 "    return None\n")  # fmt: skip
    body = {"name": "api", "steps": [{"transform": {"function": "shaping:f"}}]}
    assert client.post("/v1/http-consumers", json=body).status_code == 201


def test_a_function_file_renamed_leaves_the_consumer_list_readable(
    table: str, functions_dir: Path
) -> None:
    """A consumer made over the API with a function step; the user renames the module. The
    consumer list (and the consumer, and a retry of its failed list) answered 500: reading
    the stored consumers validates their steps, importing each function anew."""
    with api_serving(table) as client:
        _made_over_the_api(client, functions_dir)
        (functions_dir / "shaping.py").rename(functions_dir / "renamed.py")
        time.sleep(1.1)  # functions look at their file once a second
        r = client.get("/v1/http-consumers")
        assert r.status_code == 200, r.text
        assert [c["name"] for c in r.json()["data"]] == ["api"]


def test_weir_starts_when_a_consumer_made_over_the_api_names_a_function_now_gone(
    table: str, functions_dir: Path
) -> None:
    """The same, across a restart: Weir (its connectors too) does not start at all, because a
    consumer someone made over the API names a function whose file was renamed since. The
    consumer's messages could fail or wait; the rest of Weir should run."""
    with api_serving(table) as client:
        _made_over_the_api(client, functions_dir)
    (functions_dir / "shaping.py").rename(functions_dir / "renamed.py")
    port = free_port()
    run = Running(api_config(table, port))
    listening = None
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}",
                          headers={"Authorization": f"Bearer {TOKEN}"}) as c:  # fmt: skip
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and run.thread.is_alive():
                try:
                    listening = c.get("/v1/http-consumers").status_code
                    break
                except httpx.TransportError:
                    time.sleep(0.2)
    finally:
        run.stop.set()
        run.thread.join(60)
    assert run.result in ([], [0]), f"weir run exited with {run.result}"
    assert listening == 200


def test_a_function_whose_file_went_away_fails_its_messages_saying_so(
    table: str, functions_dir: Path
) -> None:
    """The failed list's reason for a function whose module file was removed while Weir ran:
    it read 'StepFailed: steps[0] transform: ValueError: shaping.__spec__ is None', where the
    check at load says 'no module shaping in DIR'."""
    write_module(functions_dir / "shaping.py", "def f(action, record, changes, metadata):\n"
           "    return {'record': record}\n")  # fmt: skip
    c = {"name": "shaped", "steps": [{"transform": {"function": "shaping:f"}}]}
    with api_serving(table, consumers=[c]) as client:
        insert_t(table, range(1, 2))
        assert len(receive_all(client, "shaped", 1)) == 1
        (functions_dir / "shaping.py").rename(functions_dir / "renamed.py")
        time.sleep(1.1)
        client.get("/v1/http-consumers")  # the listing looks at the function too
        insert_t(table, range(2, 3))
        wait_for(lambda: receive(client, "shaped") == [] and failed(client, "shaped") != [],
                 what="the message on the failed list")  # fmt: skip
        (entry,) = failed(client, "shaped")
        assert "no module shaping" in entry["error"], entry["error"]


def test_a_slow_step_does_not_hand_one_message_to_two_workers(
    table: str, functions_dir: Path
) -> None:
    """A function taking 0.8 s (within functions.timeout 3 s) and ack_wait_ms 200: the message
    was hidden from when the store handed it to the steps, so a second worker's receive
    meanwhile took it again, both workers got it, and the first one's ack counted 0. Now it is
    hidden while the steps run, and its ack_wait_ms starts when they are done."""
    write_module(functions_dir / "slow.py", "import time\n"
                 "def f(action, record, changes, metadata):\n"
                 "    time.sleep(0.8)\n    return {'record': record}\n")  # fmt: skip
    c = {"name": "slow", "ack_wait_ms": 200, "steps": [{"transform": {"function": "slow:f"}}]}
    with api_serving(table, consumers=[c], functions={"timeout": "3s"}) as client:
        insert_t(table, range(1, 2))
        wait_for(lambda: client.get("/v1/http-consumers/slow").json()["info"]["num_pending"]
                 == 1, what="the message queued")  # fmt: skip
        out: list[list[Any]] = []

        def worker() -> None:
            with httpx.Client(base_url=str(client.base_url), headers=client.headers,
                              timeout=30) as own:  # fmt: skip
                r = own.get("/v1/http-consumers/slow/next", params={"batch_size": 1})
                out.append(r.json()["data"])

        workers = [threading.Thread(target=worker) for _ in range(2)]
        for w in workers:
            w.start()
            time.sleep(0.4)
        for w in workers:
            w.join(30)
        assert sum(len(b) for b in out) == 1, out
        token = next(b for b in out if b)[0]["ack_token"]
        r = client.post("/v1/http-consumers/slow/ack", json={"ack_tokens": [token]})
        assert r.json()["count"] == 1, r.text  # the delivery it was given is the one acked
        wait_for(lambda: client.get("/v1/http-consumers/slow").json()["info"]["num_pending"]
                 == 0, what="the queue empty")  # fmt: skip
