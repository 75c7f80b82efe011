"""The embedded servers the tests and the demo rely on are the real thing."""

from __future__ import annotations

import asyncio

import nats
import psycopg

from core.embedded import EmbeddedNats, EmbeddedPostgres


def test_postgres_has_logical_replication(pg_server: EmbeddedPostgres) -> None:
    with psycopg.connect(pg_server.url) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)


def test_nats_has_jetstream_with_acks(nats_server: EmbeddedNats) -> None:
    async def roundtrip() -> tuple[int, bytes]:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="HARNESS", subjects=["harness.>"])
            ack = await js.publish("harness.a", b"hello", headers={"Nats-Msg-Id": "1"})
            again = await js.publish("harness.a", b"hello", headers={"Nats-Msg-Id": "1"})
            assert again.duplicate
            msg = await js.get_msg("HARNESS", ack.seq)
            return ack.seq, msg.data or b""
        finally:
            await nc.close()

    assert asyncio.run(roundtrip()) == (1, b"hello")
