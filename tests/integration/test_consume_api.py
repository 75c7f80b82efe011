"""The Consume API through real HTTP against `weir run` (docs/consume-api.md “Consume API”)."""

from __future__ import annotations

import http.client
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from core.api import consume
from devkit.server import free_port
from tests.helpers.api import TOKEN, api_serving, receive, receive_all, settle, wait_queued
from tests.helpers.capture import wait_for
from tests.helpers.weir import insert_t

W = {"name": "w", "stream": "events"}


def test_concurrent_workers_never_share_a_visible_message(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        insert_t(table, range(400))
        seen: list[str] = []
        lock = threading.Lock()

        def worker() -> None:
            with httpx.Client(base_url=client.base_url, headers=client.headers) as own:
                idle_since = time.monotonic()
                while time.monotonic() - idle_since < 3:
                    batch = receive(own, "w", 7)
                    if not batch:
                        time.sleep(0.05)
                        continue
                    idle_since = time.monotonic()
                    with lock:
                        seen.extend(m["record"]["id"] for m in batch)
                    time.sleep(0.01)  # others receive while this batch is outstanding
                    assert settle(own, "w", batch) == len(batch)

        with ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(worker) for _ in range(4)]:
                f.result()
        twice = [k for k, n in Counter(seen).items() if n > 1]
        assert not twice, f"delivered to two workers: {twice[:5]}"
        assert len(seen) == 400


def test_two_instances_serve_one_consumer_each_message_once(table: str) -> None:
    """The Consume API runs on every instance: two `weir run` serve the same consumer from one
    store at once, and the workers of both get every message once between them."""
    with (
        api_serving(table, consumers=[W]) as a,
        api_serving(table, first=False, consumers=[W]) as b,
    ):
        insert_t(table, range(300))
        seen: list[Any] = []
        clients = [a, b]
        deadline = time.monotonic() + 60
        while len(seen) < 300 and time.monotonic() < deadline:
            client = clients[len(seen) % 2]
            batch = receive(client, "w", 20)
            if not batch:  # the queue is still being filled
                continue
            assert settle(client, "w", batch) == len(batch)
            seen.extend(m["record"]["id"] for m in batch)
        assert len(seen) == len(set(seen)) == 300, "a message lost, or received twice"


def test_nack_redelivers_at_once_and_stale_tokens_do_nothing(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        insert_t(table, range(1))
        first = receive_one(client)
        assert receive(client, "w") == []  # invisible while outstanding
        assert settle(client, "w", [first], "nack") == 1
        again = receive(client, "w")
        assert [m["record"]["id"] for m in again] == [first["record"]["id"]]
        assert again[0]["ack_token"] != first["ack_token"]
        assert settle(client, "w", [first]) == 0  # the first delivery's token is stale
        assert settle(client, "w", again) == 1


def test_expired_visibility_redelivers(table: str) -> None:
    short = {**W, "ack_wait_ms": 1500}
    with api_serving(table, consumers=[short]) as client:
        insert_t(table, range(1))
        first = receive_one(client)
        assert receive(client, "w") == []
        time.sleep(1.6)
        again = receive(client, "w")
        assert [m["record"]["id"] for m in again] == [first["record"]["id"]]


def test_ack_is_final_across_a_restart(table: str) -> None:
    port = free_port()
    consumer = {**W, "ack_wait_ms": 1000}
    with api_serving(table, port, consumers=[consumer]) as client:
        insert_t(table, range(10))
        wait_queued(client, "w", 10)
        acked = receive_n(client, 4)
        assert settle(client, "w", acked) == 4
        pending = receive(client, "w", 3)  # delivered, never acked
        assert len(pending) == 3
    with api_serving(table, port, consumers=[consumer]) as client:
        time.sleep(1.0)  # the pending ones become visible again
        rest = receive_all(client, "w", 10 - len(acked))
        keys = [m["record"]["id"] for m in rest]
        assert not {m["record"]["id"] for m in acked} & set(keys)
        assert {m["record"]["id"] for m in pending} <= set(keys)
        assert len(keys) == len(set(keys)) == 10 - len(acked)
        time.sleep(0.3)
        assert receive(client, "w") == []


def test_grouping_holds_a_records_next_change_until_the_first_is_acked(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        insert_t(table, range(1))
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("UPDATE t SET body = 'y' WHERE id = 0")
            conn.execute("INSERT INTO t VALUES (1, 'x')")
        wait_queued(client, "w", 3)
        batch = receive(client, "w", 10)
        assert ("0", "update") not in changes(batch)  # held behind the outstanding insert of 0
        assert settle(client, "w", batch) == len(batch)
        assert ("0", "update") in changes(receive_all(client, "w", 3 - len(batch)))


def test_max_ack_pending_serves_only_redeliveries(table: str) -> None:
    with api_serving(table, consumers=[{**W, "max_ack_pending": 3}]) as client:
        insert_t(table, range(6))
        wait_queued(client, "w", 6)
        first = receive_n(client, 3)
        assert receive(client, "w", 10) == []
        assert settle(client, "w", first[:1], "nack") == 1
        got = receive(client, "w", 10)  # the nacked one takes the room its nack made
        assert [m["record"]["id"] for m in got] == [first[0]["record"]["id"]]
        assert receive(client, "w", 10) == []
        assert settle(client, "w", first[1:] + got) == 3
        assert len(receive(client, "w", 10)) == 3


def test_max_ack_pending_counts_expired_deliveries(table: str) -> None:
    """Outstanding means delivered and neither acked nor nacked, also once the visibility ran
    out: expired deliveries come back, but no new message beside them past the cap."""
    with api_serving(table, consumers=[{**W, "max_ack_pending": 2, "ack_wait_ms": 1200}]) as client:
        insert_t(table, range(4))
        wait_queued(client, "w", 4)
        a, b = receive_n(client, 2)
        time.sleep(1.3)  # both expire (and the info count is a second old)
        assert info(client)["num_ack_pending"] == 2
        again = receive(client, "w", 10)  # only the 2 redeliveries
        assert ids(again) == ids([a, b])
        assert settle(client, "w", again[:1]) == 1
        c = receive(client, "w", 10)  # the ack made room for 1 new message
        assert len(c) == 1 and ids(c) != ids([a])
        assert settle(client, "w", again[1:], "nack") == 1
        back = receive(client, "w", 10)  # the nacked one, and nothing beside it
        assert ids(back) == ids([b])
        time.sleep(1.1)
        assert info(client)["num_ack_pending"] == 2


def test_a_superseded_version_does_not_hide_the_latest(table: str) -> None:
    """A record updated twice before any receive leaves two superseded queue rows ahead of
    its latest version: one receive buries them and returns the latest."""
    with api_serving(table, consumers=[{"name": "r", "stream": "records"}]) as client:
        insert_t(table, range(1))
        for n, body in enumerate(("y", "z"), 2):
            wait_queued(client, "r", n - 1)
            with psycopg.connect(table, autocommit=True) as conn:
                conn.execute("UPDATE t SET body = %s WHERE id = 0", (body,))
        wait_queued(client, "r", 3)
        got = receive(client, "r", 10, wait_for=0)
        assert [m["record"]["data"]["body"] for m in got] == ["z"]
        assert settle(client, "r", got) == 1
        assert receive(client, "r", 10) == []


def test_max_batch_size_names_the_batch_size(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        insert_t(table, range(30))
        wait_queued(client, "w", 30)
        for path in ("/v1/http-consumers/w/next", "/api/http_pull_consumers/w/receive",
                     "/api/sequin_streams/w/receive"):  # fmt: skip
            r = client.get(path, params={"max_batch_size": 2})
            assert r.status_code == 200, r.text
            assert len(r.json()["data"]) == 2
            r = client.get(path, params={"max_batch_size": 1, "batch_size": 1})
            assert len(r.json()["data"]) == 1
            r = client.get(path, params={"max_batch_size": 3, "batch_size": 2})
            assert r.status_code == 400 and "max_batch_size" in r.json()["detail"], r.text
        post = "/api/sequin_streams/w/receive"
        assert len(client.post(post, json={"max_batch_size": 3}).json()["data"]) == 3
        r = client.post(post, json={"max_batch_size": 3, "batch_size": 2})
        assert r.status_code == 400 and "max_batch_size" in r.json()["detail"], r.text
        assert len(client.post(post, json={}).json()["data"]) == 10  # the default
        for wrong in ({"batch_size": True}, {"batch_size": "2"}, {"wait_for": 1.5}):
            r = client.post(post, json=wrong)  # JSON's own types, none taken for another
            assert r.status_code == 422 and next(iter(wrong)) in r.text, (wrong, r.text)
        schema = client.get("/openapi.json").json()
        for path in ("/v1/http-consumers/{name}/next", "/api/sequin_streams/{name}/receive"):
            names = {p["name"] for p in schema["paths"][path]["get"]["parameters"]}
            assert {"batch_size", "max_batch_size"} <= names
        assert "max_batch_size" in schema["components"]["schemas"]["StreamReceive"]["properties"]


def test_max_deliver_moves_a_message_to_the_failed_list(table: str) -> None:
    with api_serving(table, consumers=[{**W, "max_deliver": 2}]) as client:
        insert_t(table, range(2))
        batch = receive_n(client, 2)
        assert settle(client, "w", batch[1:]) == 1
        doomed = batch[0]["record"]["id"]
        assert settle(client, "w", batch[:1], "nack") == 1
        second = receive(client, "w")
        assert [m["record"]["id"] for m in second] == [doomed]
        assert settle(client, "w", second, "nack") == 1
        assert receive(client, "w") == []  # a third delivery would pass max_deliver
        failed = client.get("/v1/http-consumers/w/failed").json()["data"]
        assert [(f["idempotency_key"], f["attempts"]) for f in failed] == [(doomed, 2)]
        assert "max_deliver" in failed[0]["error"]
        one = client.get(f"/v1/http-consumers/w/failed/{failed[0]['id']}").json()
        assert one["message"]["metadata"]["idempotency_key"] == doomed


def test_a_sweep_fails_messages_past_max_deliver_without_a_receive(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consume, "SWEEP_EVERY", 0.3)
    with api_serving(table, consumers=[{**W, "max_deliver": 1, "ack_wait_ms": 200}]) as client:
        insert_t(table, range(1))
        [first] = receive_n(client, 1)  # its only delivery; never acked

        def swept() -> bool:
            failed = client.get("/v1/http-consumers/w/failed").json()["data"]
            return [f["idempotency_key"] for f in failed] == [first["record"]["id"]]

        wait_for(swept, what="the sweep")  # no receive call in between
        assert receive(client, "w") == []


def test_max_waiting_answers_429(table: str) -> None:
    with api_serving(table, consumers=[{**W, "max_waiting": 2}]) as client:
        url = "/v1/http-consumers/w/next?wait_for=3000"
        with ThreadPoolExecutor(2) as pool:
            waiting = [pool.submit(client.get, url) for _ in range(2)]
            time.sleep(0.5)
            r = client.get(url)
            assert r.status_code == 429
            assert "max_waiting" in r.json()["detail"]
            assert [f.result().status_code for f in waiting] == [200, 200]


def test_long_poll_returns_when_a_change_arrives(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        threading.Timer(0.5, insert_t, (table, range(1))).start()
        started = time.monotonic()
        got = receive(client, "w", 10, wait_for=10_000)
        assert len(got) == 1
        assert time.monotonic() - started < 5


def test_tokens_are_required(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                        {"Authorization": f"Basic {TOKEN}"}):  # fmt: skip
            r = httpx.get(f"{client.base_url}/v1/http-consumers", headers=headers)
            assert r.status_code == 401, headers
            assert r.headers["www-authenticate"] == "Bearer"
        r = httpx.get(f"{client.base_url}/openapi.json")
        assert r.status_code == 401


def test_bad_requests_get_a_4xx_with_a_reason(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        cases = [
            (client.post("/v1/http-consumers", json={"name": "x", "stream": "rows"}), 422,
             "stream"),
            (client.post("/v1/http-consumers", content=b"{not json",
                         headers={"content-type": "application/json"}), 422, "JSON"),
            (client.post("/v1/http-consumers", json=W), 409, "exists"),
            (client.post("/v1/http-consumers", json={"name": "y", "sources": ["nope"]}), 422,
             "no source named nope"),
            (client.post("/v1/http-consumers", json={"name": "z", "max_deliver": 2**31}), 422,
             "max_deliver"),  # more than the store's integer: every receive failed with a 500
            (client.get("/v1/http-consumers/nope/next"), 404, "nope"),
            (client.get("/v1/http-consumers/w/next?batch_size=0"), 422, "batch_size"),
            (client.post("/v1/http-consumers/w/ack", json={"ack_tokens": ["!!"]}), 400,
             "ack_tokens[0]"),
            (client.post("/v1/http-consumers/w/ack", json={"tokens": []}), 422, "ack_tokens"),
            (client.delete("/v1/http-consumers/w"), 409, "config file"),
            (client.post("/v1/sources/app/records", json={"records": [
                {"collection_id": "c", "record_id": "1", "data": {}}]}), 409, "postgres"),
            (client.post("/v1/sources/stripe/records", json={"records": [
                {"collection_id": "c", "record_id": "1"}]}), 422, "data is required"),
        ]  # fmt: skip

        # What JSON parsers refuse, or the store cannot hold, is refused naming why, never
        # stored as something else (NaN and 1e400 were stored as null)
        def ingest(data: str) -> httpx.Response:
            body = '{"records": [{"collection_id": "c", "record_id": "1", "data": ' + data + "}]}"
            return client.post("/v1/sources/stripe/records", content=body.encode(),
                               headers={"content-type": "application/json"})  # fmt: skip

        cases += [
            (ingest('{"x": NaN}'), 422, "json_invalid"),
            (ingest('{"x": -Infinity}'), 422, "json_invalid"),
            (ingest('{"x": 1e400}'), 422, "beyond a double"),
            (ingest('{"x": 1E-400}'), 422, "beyond a double"),  # was stored as 0.0
            (
                client.post(
                    "/v1/sources/stripe/records",
                    content=b'{"records": [{"collection_id":'
                    b' "c", "record_id": "1", "data": {"s": "a\xffb"}}]}',
                    headers={"content-type": "application/json"},
                ),
                422,
                "byte 0xff is not UTF-8",
            ),  # was stored as U+FFFD
            (ingest('{"x": "\\ud800"}'), 422, "surrogate"),
            (ingest('{"pair": "\\ud83d\\ude00", "x": "\\udc00"}'), 422, "surrogate"),
            (
                client.post(
                    "/v1/sources/stripe/records",
                    content=b'{"records": [{"collection_id":'
                    b' "c", "record_id": "\\udc00x", "data": {}}]}',
                    headers={"content-type": "application/json"},
                ),
                422,
                "surrogate",
            ),
            (ingest('{"x": %s}' % ("[" * 600 + "]" * 600)), 422, "at most 251 levels deep"),
            (ingest('{"x": 123456789012345678901234567890}'), 422, "beyond 64 bits"),
            (
                client.post(
                    "/v1/connectors",
                    content=b'{"name": "k", "type": "webhook", "stream":'
                    b' "events", "webhook": {"url": "http://127.0.0.1:1/x"}, "retry":'
                    b' {"max_attempts": 293075731846141743676306657116160}}',
                    headers={"content-type": "application/json"},
                ),
                422,
                "beyond 64 bits",
            ),  # a 500 when the connector was kept
            (
                client.post(
                    "/v1/connectors",
                    json={
                        "name": "k",
                        "type": "webhook",
                        "stream": "events",
                        "collections": ["a\x00"],
                        "webhook": {"url": "http://127.0.0.1:1/x"},
                    },
                ),
                422,
                "collections: holds a NUL character",
            ),  # a 500 from the store's jsonb
        ]
        for r, status, reason in cases:
            assert r.status_code == status, (r.request.url, r.text)
            assert reason in r.text, (r.request.url, r.text)
        assert client.get("/v1/http-consumers/w").json()["info"]["num_pending"] == 0
        ok = ingest('{"pair": "\\ud83d\\ude00"}')  # a whole pair is a character
        assert ok.status_code == 200 and ok.json()["accepted"] == 1, ok.text
        assert receive_one(client)["record"]["data"] == {"pair": "\U0001f600"}  # type: ignore[index]


def test_consumers_are_managed_over_http(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        insert_t(table, range(3))
        spec = {"name": "late", "stream": "events", "deliver_policy": "new",
                "filters": {"collection_id": "public:*", "resource_id": "1*"}}  # fmt: skip
        wait_for(lambda: len(receive(client, "w", 10)) == 3, what="the first rows captured")
        r = client.post("/v1/http-consumers", json=spec)
        assert r.status_code == 201, r.text
        assert r.json()["origin"] == "api"
        insert_t(table, range(10, 13))
        insert_t(table, range(20, 22))
        got = receive_all(client, "late", 3)
        assert sorted(m["record"]["resource_id"] for m in got) == ["10", "11", "12"]
        names = [c["name"] for c in client.get("/v1/http-consumers").json()["data"]]
        assert names == ["late", "w"]
        assert client.delete("/v1/http-consumers/late").status_code == 200
        assert client.get("/v1/http-consumers/late").status_code == 404
        assert client.get("/v1/http-consumers/late/next").status_code == 404


def test_three_route_families_serve_one_queue(table: str) -> None:
    with api_serving(table, consumers=[W]) as client:
        insert_t(table, range(3))
        wait_queued(client, "w", 3)
        pulled = client.get("/api/http_pull_consumers/w/receive?batch_size=1").json()["data"]
        assert pulled[0]["action"] == "insert" and pulled[0]["changes"] is None
        streamed = client.post("/api/sequin_streams/w/receive", json={"batch_size": 5}).json()
        data = streamed["data"]
        assert all(set(d["data"]) == {"record", "changes", "action", "metadata"} for d in data)
        ids = {pulled[0]["record"]["id"]} | {d["data"]["record"]["id"] for d in data}
        assert len(ids) == 1 + len(data)
        r = client.post("/api/sequin_streams/w/ack", json={"ack_ids": [d["ack_id"] for d in data]})
        assert r.json()["count"] == len(data)
        r = client.post("/api/http_pull_consumers/w/ack",
                        json={"ack_tokens": [pulled[0]["ack_token"]]})  # fmt: skip
        assert r.json()["count"] == 1


def test_http_ingest_keeps_the_newest_version(table: str) -> None:
    records = {"name": "r", "stream": "records", "sources": ["stripe"]}
    with api_serving(table, consumers=[W, records]) as client:

        def push(*recs: dict[str, object]) -> dict[str, int]:
            r = client.post("/v1/sources/stripe/records", json={"records": list(recs)})
            assert r.status_code == 200, r.text
            return dict(r.json())

        sub = {"collection_id": "stripe:subscription", "record_id": "sub_1"}
        # NUL is a character like any other: the store keeps JSON as text
        assert push({**sub, "data": {"plan": "a\x00"}, "version": 1}) == {"accepted": 1,
                                                                          "skipped": 0}  # fmt: skip
        assert push({**sub, "data": {"plan": "b"}, "version": 3},
                    {**sub, "data": {"plan": "old"}, "version": 2}) == {"accepted": 1,
                                                                        "skipped": 1}  # fmt: skip
        assert push({**sub, "data": {"plan": "b"}, "version": 3}) == {"accepted": 0, "skipped": 1}
        # the same record again, newer: no new version (found by an outside tryout: a push
        # without versions, sent again, was a new event each time)
        assert push({**sub, "data": {"plan": "b"}, "version": 5}) == {"accepted": 0, "skipped": 1}
        assert push({**sub, "deleted": True, "version": 6}) == {"accepted": 1, "skipped": 0}
        assert push({**sub, "deleted": True, "version": 7}) == {"accepted": 0, "skipped": 1}
        other = {"collection_id": "stripe:subscription", "record_id": "sub_2"}
        assert push({**other, "data": {"n": 1}}) == {"accepted": 1, "skipped": 0}
        assert push({**other, "data": {"n": 1}}) == {"accepted": 0, "skipped": 1}
        assert push({**other, "data": {"n": 1.0}}) == {"accepted": 1, "skipped": 0}  # as written
        for wrong in ({"deleted": "yes"}, {"deleted": 1}, {"version": "2"}, {"version": 1.0},
                      {"version": True}):  # fmt: skip
            r = client.post("/v1/sources/stripe/records",
                            json={"records": [{**other, "data": {}, **wrong}]})  # fmt: skip
            assert r.status_code == 422 and next(iter(wrong)) in r.text, (wrong, r.text)
        everything = receive_all(client, "w", 5)
        assert len(everything) == 5, everything
        of = lambda rid: [m for m in everything if m["record"]["resource_id"] == rid]  # noqa: E731
        assert [(m["record"]["action"], m["record"]["data"]) for m in of("sub_2")] == [
            ("insert", {"n": 1}), ("update", {"n": 1.0})]  # fmt: skip
        events = of("sub_1")
        assert [(m["record"]["action"], m["record"]["data"], m["record"]["changes"])
                for m in events] == [("insert", {"plan": "a\x00"}, None),
                                     ("update", {"plan": "b"}, {"plan": "a\x00"}),
                                     ("delete", {"plan": "b"}, None)]  # fmt: skip
        assert {m["record"]["provider"] for m in events} == {"stripe"}
        assert len({m["record"]["id"] for m in events}) == 3
        # the records stream: each record's newest version, in no promised order between
        # records (a superseded row buried in one round lets the other record's come first)
        latest = {m["record"]["resource_id"]: m["record"] for m in receive_all(client, "r", 2)}
        assert latest["sub_1"]["deleted"] is True
        assert (latest["sub_2"]["deleted"], latest["sub_2"]["data"]) == (False, {"n": 1.0})


def test_a_record_pushed_twice_in_a_batch_ends_as_the_batch_lists_it(table: str) -> None:
    """Without ``version``, a record's two pushes in one batch got the same time of ingest and
    the second was skipped as not newer: the record kept the first; an upsert then a delete
    with an equal ``upstream_updated_at`` kept the record alive (found by an outside tryout).
    The later one is the newer, as the batch lists them; equal explicit versions keep the
    first; a time before 1970 (a negative version) is refused."""
    with api_serving(table, consumers=[W]) as client:

        def push(*recs: dict[str, object]) -> httpx.Response:
            return client.post("/v1/sources/stripe/records", json={"records": list(recs)})

        r10 = {"collection_id": "c", "record_id": "r10"}
        r11 = {
            "collection_id": "c",
            "record_id": "r11",
            "upstream_updated_at": "2026-01-01T00:00:00Z",
        }
        r12 = {"collection_id": "c", "record_id": "r12", "version": 6}
        got = push({**r10, "data": {"a": 1}}, {**r10, "data": {"a": 2}},
                   {**r11, "data": {"a": 1}}, {**r11, "deleted": True},
                   {**r12, "data": {"a": "C"}}, {**r12, "data": {"a": "D"}})  # fmt: skip
        assert got.json() == {"accepted": 5, "skipped": 1}, got.text
        events = receive_all(client, "w", 5)
        by_record: dict[str, list[tuple[str, object]]] = {}
        for m in events:  # a record's messages in order; records among them in any order
            by_record.setdefault(m["record"]["resource_id"], []).append(
                (m["record"]["action"], m["record"]["data"])
            )
        assert by_record == {"r10": [("insert", {"a": 1}), ("update", {"a": 2})],
                             "r11": [("insert", {"a": 1}), ("delete", {"a": 1})],
                             "r12": [("insert", {"a": "C"})]}  # fmt: skip
        old = push({**r10, "data": {"a": 3}, "upstream_updated_at": "1969-12-31T23:59:59Z"})
        assert old.status_code == 422 and "before 1970" in old.text, old.text
        assert push({**r10, "data": {"a": 2}}).json() == {"accepted": 0, "skipped": 1}
        # A delete of a record never pushed is a tombstone at its version: an older push of
        # the record after it is skipped. A key given twice keeps its last value.
        ghost = {"collection_id": "c", "record_id": "ghost"}
        assert push({**ghost, "deleted": True, "version": 5}).json() == {"accepted": 1,
                                                                         "skipped": 0}  # fmt: skip
        assert push({**ghost, "data": {"a": 1}, "version": 3}).json() == {"accepted": 0,
                                                                          "skipped": 1}  # fmt: skip
        twice = client.post("/v1/sources/stripe/records",
                            headers={"content-type": "application/json"},
                            content=b'{"records": [{"collection_id": "c", "record_id": "dup",'
                                    b' "data": {"a": 1, "a": 2}}]}')  # fmt: skip
        assert twice.json() == {"accepted": 1, "skipped": 0}, twice.text
        got = {m["record"]["resource_id"]: (m["record"]["action"], m["record"]["data"])
               for m in receive_all(client, "w", 2)}  # fmt: skip
        assert got == {"ghost": ("delete", {}), "dup": ("insert", {"a": 2})}


def ids(batch: list[Any]) -> list[str]:
    return [m["record"]["id"] for m in batch]


def info(client: httpx.Client) -> dict[str, int]:
    return dict(client.get("/v1/http-consumers/w").json()["info"])


def changes(batch: list[Any]) -> list[tuple[str, str]]:
    return [(m["record"]["resource_id"], m["record"]["action"]) for m in batch]


def receive_one(client: httpx.Client) -> dict[str, object]:
    return receive_n(client, 1)[0]


def receive_n(client: httpx.Client, n: int) -> list[dict[str, object]]:
    """Wait until ``n`` messages are receivable in one call (they are left outstanding)."""
    got: list[dict[str, object]] = []

    def ready() -> bool:
        got.extend(receive(client, "w", n - len(got)))
        return len(got) >= n

    wait_for(ready, what=f"{n} messages")
    return got


def test_an_answer_does_not_wait_for_the_clients_delayed_ack(table: str) -> None:
    """Each answer leaves at once: the API's connections have TCP_NODELAY, as asyncio gives
    the sockets it makes. Without it, an answer written in two parts (head, then body) waited
    for the client's delayed ACK, 40 ms or more a request (4,000 messages/s for 4 workers)."""
    port = free_port()
    api = {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}
    with api_serving(table, port, api=api, consumers=[{"name": "w", "stream": "events"}]):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # keep-alive, no nodelay
        took = []
        for _ in range(20):
            start = time.perf_counter()
            conn.request("GET", "/v1/http-consumers/w/next?wait_for=0",
                          headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            r = conn.getresponse()
            assert r.status == 200 and r.read()
            took.append(time.perf_counter() - start)
        conn.close()
    assert statistics.median(took) < 0.03, took


def test_a_consumers_record_id_pattern_matches_ids_as_they_were_pushed(table: str) -> None:
    """Record ids are kept as subject tokens (``a.b`` as ``a%2Eb``): a pattern written with the
    id as pushed matched nothing, silently (found by an outside tryout). Either form matches."""
    picky = {"name": "picky", "stream": "events", "sources": ["stripe"],
             "filters": {"resource_id": "a.b*"}}  # fmt: skip
    encoded = {"name": "encoded", "stream": "events", "sources": ["stripe"],
               "filters": {"resource_id": "a%2Eb*"}}  # fmt: skip
    with api_serving(table, consumers=[picky, encoded]) as client:
        ids = ["a.b", "a.bc", "é", "ab", "a%2Eb"]
        r = client.post("/v1/sources/stripe/records", json={"records": [
            {"collection_id": "c", "record_id": i, "data": {}} for i in ids]})  # fmt: skip
        assert r.status_code == 200, r.text
        got = receive_all(client, "picky", 2)
        assert sorted(m["record"]["resource_id"] for m in got) == ["a%2Eb", "a%2Ebc"]
        # the token form matches too, and read as pushed text, the id a%2Eb (kept as a%252Eb)
        got = receive_all(client, "encoded", 3)
        assert sorted(m["record"]["resource_id"] for m in got) == ["a%252Eb", "a%2Eb", "a%2Ebc"]
