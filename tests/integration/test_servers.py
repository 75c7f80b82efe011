"""The embedded servers the tests and the demo rely on are the real thing."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from pathlib import Path

import nats
import psycopg
import pytest

from devkit.embedded import EmbeddedNats, EmbeddedPostgres, postgres_bindir


def test_postgres_has_logical_replication(pg_server: EmbeddedPostgres) -> None:
    with psycopg.connect(pg_server.url) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)


def test_postgres_runs_from_an_install_in_a_private_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkout may sit in a 0700 dir (root's home is one). As root, where postgres runs as
    nobody, the server gets a copy of the install that nobody can reach, made once and reused;
    as any other user it runs from the install where it is. Both from a cwd only we can enter.
    """
    monkeypatch.delenv("WEIR_PG_BINDIR", raising=False)
    bindir = postgres_bindir().resolve()  # the pgserver wheel's, with its libpq two dirs up
    site = bindir.parents[2]
    private = tmp_path / "private"
    private.mkdir()
    private.chmod(0o700)
    for part in (*(bindir.parent / p for p in ("bin", "lib", "share")), site / "pgserver.libs"):
        shutil.copytree(part, private / part.relative_to(site), symlinks=True)
    bindir = private / bindir.relative_to(site)
    monkeypatch.setenv("WEIR_PG_BINDIR", str(bindir))
    monkeypatch.chdir(private)
    shared = Path(tempfile.mkdtemp(prefix="weir-test-"))  # a temp dir of the test's own
    shared.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    try:
        with EmbeddedPostgres() as server, psycopg.connect(server.url) as conn:
            assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        copies = list(shared.glob("weir-pginstall-*"))
        if os.geteuid() == 0:
            assert len(copies) == 1 and server.bindir.is_relative_to(copies[0])
            st = copies[0].stat()
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
            again = EmbeddedPostgres()
            again.cleanup()
            assert again.bindir == server.bindir
        else:
            assert (server.bindir, copies) == (bindir, [])
    finally:
        shutil.rmtree(shared)


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
