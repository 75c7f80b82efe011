"""The Consume API under random worker behaviour: generated sequences of receive, ack, nack
(with current and stale tokens) and visibility expiry against a real `weir run`. A model of
what is outstanding (delivered, neither acked nor nacked: docs/consume-api.md “Delivery”) checks
after every step that the store agrees, that ``max_ack_pending`` is never passed, that each answer
to an ack or nack counts exactly the current deliveries, and that each record's changes come
in order, one outstanding at a time."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.api import api_serving, receive, wait_queued

RECORDS = 6
VERSIONS = 3  # an insert and two updates a record: 18 events
ACK_WAIT_MS = 300

Step = tuple[str, int, int]  # (op, a, b): receive batch a; settle b tokens from held index a

steps = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), st.integers(1, 5), st.just(0)),
        st.tuples(st.sampled_from(["ack", "nack"]), st.integers(0, 50), st.integers(1, 3)),
        st.tuples(st.just("expire"), st.just(0), st.just(0)),
    ),
    min_size=3,
    max_size=14,
)


@pytest.fixture(scope="module")
def api(adv_db: str) -> Iterator[httpx.Client]:
    """Weir serving the API over a table of RECORDS records, each changed VERSIONS times."""
    with psycopg.connect(adv_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text NOT NULL)")
    with api_serving(adv_db) as client:
        with psycopg.connect(adv_db, autocommit=True) as conn:
            for v in range(VERSIONS):
                for i in range(RECORDS):
                    if v == 0:
                        conn.execute("INSERT INTO t VALUES (%s, 'v0')", (i,))
                    else:
                        conn.execute("UPDATE t SET body = %s WHERE id = %s", (f"v{v}", i))
        yield client


@dataclass
class Model:
    """What a consumer's queue must hold, from the answers the workers got."""

    cap: int
    current: dict[str, str] = field(default_factory=dict)  # message key -> its latest token
    outstanding: set[str] = field(default_factory=set)  # message keys
    record_of: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (record, seq)
    acked: set[str] = field(default_factory=set)
    held: list[tuple[str, str]] = field(default_factory=list)  # (token, key), stale ones too

    def delivered(self, batch: list[Any]) -> None:
        for m in batch:
            key, rec = m["record"]["id"], m["record"]
            record, seq = rec["resource_id"], int(rec["seq"])
            self.record_of[key] = (record, seq)
            assert key not in self.acked, f"{key} delivered after its ack"
            earlier = [k for k, (r, s) in self.record_of.items() if r == record and s < seq]
            assert all(k in self.acked for k in earlier), f"{record}: {seq} before an earlier one"
            others = [k for k in self.outstanding if k != key and self.record_of[k][0] == record]
            assert not others, f"{record}: two outstanding at once"
            self.current[key] = m["ack_token"]
            self.outstanding.add(key)
            self.held.append((m["ack_token"], key))

    def settled(self, chosen: list[tuple[str, str]], ack: bool) -> int:
        """How many of these tokens the API must count, applying them to the model."""
        matched = 0
        for token, key in dict.fromkeys(chosen):  # a token given twice counts once
            if self.current.get(key) != token or (not ack and key not in self.outstanding):
                continue
            matched += 1
            self.outstanding.discard(key)
            if ack:
                del self.current[key]
                self.acked.add(key)
        return matched


def _outstanding_in_store(url: str, consumer: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM weir.consumer_messages WHERE consumer = %s AND outstanding",
            (consumer,),
        ).fetchone()
    return int(row[0]) if row else -1


def test_outstanding_deliveries_never_pass_max_ack_pending(adv_db: str, api: httpx.Client) -> None:
    names = (f"h{i}" for i in itertools.count())

    @given(cap=st.integers(1, 4), script=steps)
    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def run(cap: int, script: list[Step]) -> None:
        name = next(names)
        spec = {"name": name, "stream": "events", "max_ack_pending": cap,
                "ack_wait_ms": ACK_WAIT_MS}  # fmt: skip
        assert api.post("/v1/http-consumers", json=spec).status_code == 201
        wait_queued(api, name, RECORDS * VERSIONS)
        model = Model(cap)
        for op, a, b in script:
            if op == "receive":
                model.delivered(receive(api, name, a))
            elif op == "expire":
                time.sleep(ACK_WAIT_MS / 1000 + 0.05)
            elif model.held:
                chosen = [model.held[(a + i) % len(model.held)] for i in range(b)]
                r = api.post(f"/v1/http-consumers/{name}/{op}",
                             json={"ack_tokens": [t for t, _ in chosen]})  # fmt: skip
                assert r.status_code == 200, r.text
                assert r.json()["count"] == model.settled(chosen, op == "ack"), (op, chosen)
            assert len(model.outstanding) <= cap
            assert _outstanding_in_store(adv_db, name) == len(model.outstanding)
        # Every message still comes, in order: the model checks each delivery.
        deadline = time.monotonic() + 15
        while len(model.acked) < RECORDS * VERSIONS and time.monotonic() < deadline:
            batch = receive(api, name, 10)
            model.delivered(batch)
            if not batch:
                time.sleep(0.1)
                continue
            tokens = [m["ack_token"] for m in batch]
            r = api.post(f"/v1/http-consumers/{name}/ack", json={"ack_tokens": tokens})
            assert r.json()["count"] == model.settled(model.held[-len(batch) :], True)
        assert len(model.acked) == RECORDS * VERSIONS
        assert api.delete(f"/v1/http-consumers/{name}").status_code == 200

    run()
