"""Brokers that refuse messages, close connections because of one, are down at start, or are
shared by connectors: every change reaches the subscriber, or the failed list with its reason,
and the connector goes on (docs/design.md “Guarantees”)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.js.api import StreamConfig

from devkit.embedded import EmbeddedNats
from devkit.server import free_port
from tests.connectors.nats.harness import NatsHarness, read_stream
from tests.helpers.capture import wait_for
from tests.helpers.load import WeirProcess, create_load_table, load_with_interruptions
from tests.helpers.sql import execute
from tests.helpers.weir import cursor_of, failed_messages, serving, weir_config


def _server(tmp_path: Path, conf: str) -> EmbeddedNats:
    path = tmp_path / "nats.conf"
    path.write_text(conf)
    return EmbeddedNats(args=["-c", str(path)])


def _stream(url: str, name: str, subjects: list[str], batched: bool = False, **auth: str) -> None:
    async def make() -> None:
        nc = await nats.connect(url, **auth)
        config = StreamConfig(name=name, subjects=subjects, allow_batched=batched)
        await nc.jetstream().add_stream(config)
        await nc.close()

    asyncio.run(make())


def _connector(name: str, url: str, namespace: str, stream: str, **extra: Any) -> dict[str, Any]:
    nats_cfg = {"url": url, "namespace": namespace,
                "events_stream": {"name": stream, "subjects": ["sequin-events.>"]}}  # fmt: skip
    return {"name": name, "type": "nats", "stream": "events", "nats": nats_cfg, **extra}


def _settled(url: str, connector: str, n: int) -> None:
    wait_for(lambda: cursor_of(url, connector)[0] >= n, timeout=90, what=f"{connector} past {n}")


def test_two_namespaces_publishing_into_one_stream_are_both_stored(
    table: str, tmp_path: Path
) -> None:
    """One JetStream stream takes ``sequin-events.>`` (as weir nats setup makes it); two
    connectors of one source publish there under two namespaces: JetStream deduplicates per
    stream, so their Nats-Msg-Ids differ by namespace and both copies are stored."""
    with _server(tmp_path, "") as server:
        _stream(server.url, "ALL-EVENTS", ["sequin-events.>"])
        a = _connector("alpha", server.url, "alpha", "ALL-EVENTS")
        b = _connector("beta", server.url, "beta", "ALL-EVENTS")
        with serving(weir_config(table, [a, b])):
            execute(table, "INSERT INTO t SELECT i, 'x' FROM generate_series(1, 20) i")
            _settled(table, "alpha", 20)
            _settled(table, "beta", 20)
        got = asyncio.run(read_stream(server.url, "ALL-EVENTS", {}))
    ids = sorted(d.key for d in got)
    assert len(ids) == len(set(ids)) == 40
    for d in got:
        namespace = d.key.split(":", 1)[0]
        assert d.key == f"{namespace}:{d.payload['metadata']['idempotency_key']}"
    assert {d.key.split(":", 1)[0] for d in got} == {"alpha", "beta"}


@pytest.mark.parametrize("batched", [False, True], ids=["singly", "fast-batches"])
def test_messages_the_server_refuses_go_to_the_failed_list_and_the_rest_goes_on(
    table: str, tmp_path: Path, batched: bool
) -> None:
    """A payload that fits max_payload only without its Nats-Msg-Id header; a subject past the
    server's control line (it closes the connection for it: charged after 3 tries alone); a
    subject the user may not publish to. Each lands on the failed list with its reason, and
    every other change is delivered, in order: published singly or in fast batches (where the
    server ends a batch at the refused subject)."""
    conf = """
    max_payload: 2048
    max_control_line: 512
    authorization {
      users = [
        {user: weir, password: weir-secret, permissions: {
          publish: {allow: ["sequin-events.ns.*.*.public:t.>", "$JS.API.>", "_INBOX.>"]},
          subscribe: {allow: ["_INBOX.>"]}}},
        {user: reader, password: reader-secret}
      ]
    }
    """
    long_table = "t" + "é" * 31  # its collection token is 190 characters once encoded
    execute(table, f'CREATE TABLE "{long_table}" (id text PRIMARY KEY)',
          "CREATE TABLE denied (id int PRIMARY KEY)")  # fmt: skip
    with _server(tmp_path, conf) as server:
        reader = {"user": "reader", "password": "reader-secret"}
        _stream(server.url, "EVENTS", ["sequin-events.>"], batched, **reader)
        c = _connector("hooks", server.url, "ns", "EVENTS", retry={"initial": "10ms"})
        c["nats"] |= {"user": "weir", "password": "weir-secret"}
        with serving(weir_config(table, [c])):
            for n in range(1400, 1800, 25):  # some fit with their header, some do not
                execute(table, "INSERT INTO t VALUES (%s, %s)", params=(n, "x" * n))
            execute(table, f'INSERT INTO "{long_table}" VALUES (%s)', params=("k" * 250,))
            execute(table, "INSERT INTO denied VALUES (1)", "INSERT INTO t VALUES (1, 'last')")
            _settled(table, "hooks", 16 + 3)
        got = asyncio.run(read_stream(server.url, "EVENTS", reader))
    failed = failed_messages(table, "hooks")
    reasons = {json.loads(f["payload"])["metadata"]["collection_id"]: f["error"] for f in failed}
    assert "denied" in " ".join(reasons), reasons
    assert "NATS refused the subject" in reasons["public:denied"]
    assert "sent alone" in reasons[f"public:{long_table}"]
    too_big = [f for f in failed if f["error"].startswith("FatalError: message of")]
    assert too_big and all("with its headers is over the server's max_payload" in f["error"]
                           for f in too_big)  # fmt: skip
    delivered = [d.payload["record"]["id"] for d in got]
    assert delivered[-1] == 1  # the connector went on past every refusal
    assert len(delivered) + len(failed) == 16 + 3


def test_a_broker_down_at_start_is_waited_for_and_said(table: str) -> None:
    """NATS is not up when weir run starts: the connector says why it waits (weir status's
    state), and delivers everything once NATS comes up."""
    port = free_port()
    server = EmbeddedNats(port=port)
    c = NatsHarness(server).connector("late", "events")
    with serving(weir_config(table, [c])):
        execute(table, "INSERT INTO t VALUES (1, 'x')")

        def said() -> bool:
            with psycopg.connect(table) as conn:
                row = conn.execute("SELECT state, detail FROM weir.owners"
                                   " WHERE work = 'connector:late'").fetchone()  # fmt: skip
            # connecting again, it still says why the last attempt failed
            return row is not None and row[0] in ("reconnecting", "connecting") and (
                "cannot reach NATS" in row[1])  # fmt: skip

        wait_for(said, what="the connector to say it cannot reach NATS")
        with server:
            NatsHarness(server).prepare(c)
            _settled(table, "late", 1)


_KEY_PART = st.one_of(
    st.none(), st.just(""), st.sampled_from(["None", "%NULL", "a.b", "*", ">", " "]),
    st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20),
    st.text("é中😀k", min_size=200, max_size=900),
)  # fmt: skip


def test_generated_keys_make_one_record_each(table: str, nats_server: EmbeddedNats) -> None:
    """Keys of every shape (NULL, empty, look-alikes of NULL, unicode, kilobytes long, in two
    columns): each row is one record with one subject, its id in metadata whole, and every
    subject well within NATS's limits."""
    execute(table, "CREATE TABLE k (a text, b text, v int)", "ALTER TABLE k REPLICA IDENTITY FULL")
    harness = NatsHarness(nats_server)
    c = harness.connector("keys", "records")
    harness.prepare(c)
    counter = iter(range(1_000_000))
    with serving(weir_config(table, [c], key_columns={"public.k": ["a", "b"]})):

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(st.tuples(_KEY_PART, _KEY_PART), min_size=1, max_size=6, unique=True))
        def case(keys: list[tuple[str | None, str | None]]) -> None:
            execute(table, "DELETE FROM k")
            tag = next(counter)
            with psycopg.connect(table, autocommit=True) as conn, conn.transaction():
                for a, b in keys:
                    conn.execute("INSERT INTO k VALUES (%s, %s, %s)", (a, b, tag))

            def delivered() -> list[Any]:
                got = [d for d in harness.read(c)
                       if d.payload["metadata"]["collection_id"] == "public:k"
                       and d.payload["record"].get("v") == tag]  # fmt: skip
                return got if len(got) >= len(keys) else []

            wait_for(lambda: bool(delivered()), timeout=60, what=f"{len(keys)} records")
            got = delivered()
            ids = [d.payload["metadata"]["record_id"] for d in got]
            assert len(set(ids)) == len(keys)
            assert {(d.payload["record"]["a"], d.payload["record"]["b"]) for d in got} == set(keys)
            assert len({d.subject for d in got}) == len(keys)
            assert max(len(d.subject) for d in got) < 600  # long ids are hashed in subjects

        case()


def test_streams_split_by_event_type_are_read_back_after_a_crash(
    db_url: str, tmp_path: Path
) -> None:
    """Three JetStream streams take one connector's events, split by event type, each with a
    100 ms duplicate window (a restart after the default 2 minutes): after SIGKILLs under load
    the read-back finds what each stream took, and every event is stored once."""
    create_load_table(db_url)
    with _server(tmp_path, "") as server:
        for kind in ("inserted", "updated", "deleted"):

            async def make(kind: str = kind) -> None:
                nc = await nats.connect(server.url)
                await nc.jetstream().add_stream(StreamConfig(
                    name=f"EV-{kind.upper()}", subjects=[f"sequin-events.ns.*.*.*.*.{kind}"],
                    duplicate_window=0.1))  # fmt: skip
                await nc.close()

            asyncio.run(make())
        c = _connector("split", server.url, "ns", "EV-INSERTED", batch={"max_messages": 100})
        cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                            "tables": ["public.load"]}], "connectors": [c]}  # fmt: skip
        config = tmp_path / "weir.yaml"
        config.write_text(json.dumps(cfg))
        with WeirProcess(config, tmp_path / "weir.log") as weir:
            expected = load_with_interruptions(db_url, 2000, [600, 1400], weir.kill_and_restart)
            _settled(db_url, "split", len(expected))
            weir.stop()
        got = [d for kind in ("INSERTED", "UPDATED", "DELETED")
               for d in asyncio.run(read_stream(server.url, f"EV-{kind}", {}))]  # fmt: skip
    keys = [d.key for d in got]
    assert len(keys) == len(set(keys)) == len(expected)
