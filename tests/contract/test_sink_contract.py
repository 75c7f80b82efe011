"""What every sink guarantees (docs/design.md “Guarantees”), checked against its real broker."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from tests.helpers.brokers import Delivered, Harness, wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, failed_messages, serving, store_events, weir_config

FAST_RETRY = {"initial": "10ms", "max": "50ms", "max_attempts": 3}


def _table(url: str, name: str = "load") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL)")


def _insert(url: str, ids: range, table: str = "load") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for i in ids:
            conn.execute(f"INSERT INTO {table} VALUES (%s, 0)", (i,))


def _assert_once_in_order(got: list[Delivered], expected_seqs: list[int]) -> None:
    keys = [d.key for d in got]
    assert len(keys) == len(set(keys)), "a message reached the broker twice"
    assert sorted(d.seq for d in got) == expected_seqs
    by_group: dict[Any, list[int]] = defaultdict(list)
    for d in got:
        by_group[d.group].append(d.seq)
    for group, seqs in by_group.items():
        assert seqs == sorted(seqs), f"group {group} out of order: {seqs}"
    for d in got:
        assert d.key == d.payload["metadata"]["idempotency_key"]


def test_per_record_order_under_concurrent_updates(broker: Harness, db_url: str) -> None:
    """Also with steps that change nothing (docs/transforms.md): the same messages."""
    _table(db_url)
    events = broker.connector("events", "events", batch={"max_messages": 50})
    recs = broker.connector("records", "records")
    identity = [{"filter": "True"}, {"transform": {"drop": []}}]
    stepped = broker.connector("stepped", "events", batch={"max_messages": 50}, steps=identity)
    for c in (events, recs, stepped):
        broker.prepare(c)

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with psycopg.connect(db_url, autocommit=True) as conn:
            for _ in range(250):  # bounded load: 4 writers x 250 updates of 20 records
                conn.execute("UPDATE load SET v = v + 1 WHERE id = %s", (rng.randint(1, 20),))

    with serving(weir_config(db_url, [events, recs, stepped])):
        _insert(db_url, range(1, 21))
        threads = [threading.Thread(target=writer, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(lambda: len(store_events(db_url)) == 1020, what="capture of 1020 changes")
        got = wait_delivered(broker, events, 1020)
        _assert_once_in_order(got, list(range(1, 1021)))
        through_steps = wait_delivered(broker, stepped, 1020)
        assert {d.key: d.payload for d in through_steps} == {d.key: d.payload for d in got}
        wait_for(lambda: cursor_of(db_url, "records")[0] > 0, what="records cursor")
        records = broker.read(recs)
    with psycopg.connect(db_url) as conn:
        table = dict(conn.execute("SELECT id, v FROM load").fetchall())
    latest = {int(d.payload["record"]["id"]): d.payload["record"]["v"] for d in records}
    assert latest == table, "the last record message per record is not the table's row"
    by_group: dict[Any, list[int]] = defaultdict(list)
    for d in records:
        by_group[d.group].append(d.seq)
    assert all(s == sorted(s) for s in by_group.values())


def test_restart_after_crash_resends_nothing_the_broker_has(broker: Harness, db_url: str) -> None:
    """A cursor saved before the broker took more (what a crash leaves behind): on restart the
    broker is read back, so nothing is sent twice even with no duplicate window to hide it.
    A destination that cannot be read back (webhooks) gets again exactly what came after the
    saved cursor, in order, and receivers drop it by idempotency key.
    """
    _table(db_url)
    conn_cfg = broker.connector("events", "events", batch={"max_messages": 10})
    broker.prepare(conn_cfg, dedupe=False)
    cfg = weir_config(db_url, [conn_cfg])
    with serving(cfg):
        _insert(db_url, range(1, 31))
        wait_delivered(broker, conn_cfg, 30)
        wait_for(lambda: cursor_of(db_url, "events")[0] == 30, what="cursor at 30")
        stale = cursor_of(db_url, "events")
        _insert(db_url, range(31, 61))
        wait_delivered(broker, conn_cfg, 60)
    with psycopg.connect(db_url, autocommit=True) as conn:  # back to the older cursor
        conn.execute(
            "UPDATE weir.cursors SET seq = %s, broker_state = %s WHERE connector = 'events'",
            (stale[0], psycopg.types.json.Jsonb(stale[1])),
        )
    time.sleep(0.3)  # past the broker's duplicate window
    with serving(cfg):
        _insert(db_url, range(61, 71))
        got = wait_delivered(broker, conn_cfg, 100 if broker.replays else 70)
        wait_for(lambda: cursor_of(db_url, "events")[0] == 70, what="cursor at 70")
    got = broker.read(conn_cfg)
    if broker.replays:
        again = got[60:]
        assert sorted(d.seq for d in got[:60]) == list(range(1, 61))
        assert sorted(d.seq for d in again) == list(range(31, 71))
        got = got[:60] + [d for d in again if d.seq > 60]
    _assert_once_in_order(got, list(range(1, 71)))
    assert len(got) == 70


def test_restart_from_cursor_and_start_positions(broker: Harness, db_url: str) -> None:
    _table(db_url)
    first = broker.connector("first", "events")
    broker.prepare(first)
    with serving(weir_config(db_url, [first])):
        _insert(db_url, range(1, 11))
        wait_delivered(broker, first, 10)
    with psycopg.connect(db_url) as conn:
        since = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    _insert(db_url, range(11, 21))  # while weir is down
    with serving(weir_config(db_url, [first])):
        _assert_once_in_order(wait_delivered(broker, first, 20), list(range(1, 21)))
    # Created now: 'end' starts after the 20 stored messages, {seq: 15} at seq 15, {time} at
    # the first change committed after `since` (seq 11).
    late = broker.connector("late", "events", start_position="end")
    from_seq = broker.connector("from-seq", "events", start_position={"seq": 15})
    from_time = broker.connector("from-time", "events", start_position={"time": since})
    for c in (late, from_seq, from_time):
        broker.prepare(c)
    with serving(weir_config(db_url, [first, late, from_seq, from_time])):
        wait_for(lambda: cursor_of(db_url, "late")[0] == 20, what="late connector's cursor")
        _insert(db_url, range(21, 26))
        _assert_once_in_order(wait_delivered(broker, first, 25), list(range(1, 26)))
        _assert_once_in_order(wait_delivered(broker, late, 5), list(range(21, 26)))
        _assert_once_in_order(wait_delivered(broker, from_seq, 11), list(range(15, 26)))
        _assert_once_in_order(wait_delivered(broker, from_time, 15), list(range(11, 26)))


def test_poison_message_blocks_only_its_group(broker: Harness, db_url: str) -> None:
    """The broker refuses one collection: its messages go to the failed list after
    max_attempts, in their order, and every other message is delivered meanwhile.
    """
    _table(db_url)
    _table(db_url, "other")
    c = broker.connector("events", "events", retry=FAST_RETRY)
    broker.prepare(c, only=["public:load"])
    with serving(weir_config(db_url, [c])):
        _insert(db_url, range(1, 6))
        _insert(db_url, range(1, 3), table="other")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE other SET v = 1 WHERE id = 1")
            conn.execute("UPDATE load SET v = 1")
        wait_for(lambda: cursor_of(db_url, "events")[0] == 13, what="cursor past the poison")
    got = broker.read(c)
    assert [d.group[1] for d in got] == ["public:load"] * 10
    _assert_once_in_order(got, [1, 2, 3, 4, 5, 9, 10, 11, 12, 13])
    failed = failed_messages(db_url, "events")
    assert [(f["seq"], f["attempts"]) for f in failed] == [(6, 3), (7, 3), (8, 3)]
    assert all(f["error"] for f in failed)
    assert failed[0]["payload"].startswith('{"record":')


def test_message_over_the_size_limit_goes_to_the_failed_list(broker: Harness, db_url: str) -> None:
    """A message the broker can never take fails at once, with the broker's reason; the
    others are delivered.
    """
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text NOT NULL)")
    c = broker.connector("events", "events")
    broker.prepare(c)
    broker.limit_size(c, 4096)
    with serving(weir_config(db_url, [c])), psycopg.connect(db_url, autocommit=True) as conn:
        for i in range(1, 6):
            conn.execute("INSERT INTO t VALUES (%s, %s)", (i, "y" * 10_000 if i == 3 else "x"))
        wait_for(lambda: cursor_of(db_url, "events")[0] == 5, what="cursor past the big one")
    assert sorted(d.seq for d in broker.read(c)) == [1, 2, 4, 5]
    [failed] = failed_messages(db_url, "events")
    assert failed["seq"] == 3 and failed["attempts"] == 1
    assert broker.too_large in failed["error"]


@pytest.mark.parametrize("stream", ["records", "events"])
def test_filters_select_messages(broker: Harness, db_url: str, stream: str) -> None:
    _table(db_url)
    _table(db_url, "other")
    c = broker.connector(
        "filtered", stream, collections=["public:lo*"],
        filters=[{"column": "v", "op": ">=", "value": 5}],
    )  # fmt: skip
    broker.prepare(c)
    with serving(weir_config(db_url, [c])):
        with psycopg.connect(db_url, autocommit=True) as conn:
            for i in range(10):
                conn.execute("INSERT INTO load VALUES (%s, %s)", (i, i))
                conn.execute("INSERT INTO other VALUES (%s, %s)", (i, i))
        wait_for(lambda: cursor_of(db_url, "filtered")[0] == 20, what="cursor at the head")
    got = broker.read(c)
    assert sorted(d.payload["record"]["v"] for d in got) == [5, 6, 7, 8, 9]
    assert {d.group[1] for d in got} == {"public:load"}


def test_a_route_step_sends_each_message_where_its_template_says(
    broker: Harness, db_url: str
) -> None:
    """docs/transforms.md “Route”: the connector type's route field from a template over the
    record (NATS subject, Kafka key, SQS group, webhook path), each message once and in order."""
    _table(db_url)
    route = {broker.route_field: "v{record.v}.{record.id}"}
    c = broker.connector("routed", "events", steps=[{"route": route}])
    broker.prepare(c)
    with serving(weir_config(db_url, [c])), psycopg.connect(db_url, autocommit=True) as conn:
        _insert(db_url, range(1, 6))
        for i in (2, 4):
            conn.execute("UPDATE load SET v = 7 WHERE id = %s", (i,))
        got = wait_delivered(broker, c, 7)
    _assert_once_in_order(got, list(range(1, 8)))
    for d in got:
        rec = d.payload["record"]
        assert d.where.endswith(f"v{rec['v']}.{rec['id']}"), (d.where, rec)
