"""NATS connector specifics: broker dedupe, auth, `weir nats setup`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, insert_t, serving, weir_config


def test_replay_inside_the_duplicate_window_is_dropped_by_msg_id(
    nats_server: EmbeddedNats, table: str
) -> None:
    """A cursor forgotten altogether (no mark to read back from): JetStream's Nats-Msg-Id
    dedupe still keeps each message once while its duplicate window lasts.
    """
    broker = NatsHarness(nats_server)
    c = broker.connector("events", "events")
    broker.prepare(c)
    cfg = weir_config(table, [c])
    with serving(cfg):
        insert_t(table, range(1, 21))
        wait_for(lambda: cursor_of(table, "events")[0] == 20, what="20 delivered")
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("UPDATE weir.cursors SET seq = 0, broker_state = NULL")
    with serving(cfg):
        wait_for(lambda: cursor_of(table, "events")[0] == 20, what="the replay")
    got = broker.read(c)
    assert sorted(d.seq for d in got) == list(range(1, 21))


@pytest.mark.parametrize(
    ("server_args", "auth"),
    [
        (["--user", "weir", "--pass", "s3cret-pass"], {"user": "weir", "password": "s3cret-pass"}),
        (["--auth", "s3cret-token"], {"token": "s3cret-token"}),
    ],
    ids=["user-password", "token"],
)
def test_auth(
    table: str, server_args: list[str], auth: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    with EmbeddedNats(args=server_args) as server:
        bad = NatsHarness(server, {k: "wrong" for k in auth}).connector("bad", "events")
        with pytest.raises(Exception, match=r"at 127\.0\.0\.1:\d+: it refused the credentials"):
            asyncio.run(ensure_streams(NatsConnector.model_validate(bad)))
        broker = NatsHarness(server, auth)
        c = broker.connector("events", "events")
        broker.prepare(c)
        with serving(weir_config(table, [c])):
            insert_t(table, range(1, 4))
            wait_for(lambda: cursor_of(table, "events")[0] == 3, what="3 delivered")
        assert len(broker.read(c)) == 3
    assert not any("s3cret" in r.getMessage() for r in caplog.records)


def test_a_refusal_names_the_credentials_to_check() -> None:
    """The one line of a refusal names the credentials the config gives: in nats.url it
    named nats.user/password (found by an outside tryout), and none at all when the server
    asks for some."""
    with EmbeddedNats(args=["--user", "weir", "--pass", "s3cret-pass"]) as server:
        wrong = server.url.replace("nats://", "nats://weir:wrong@")

        def refusal(**nats: object) -> str:
            c = NatsHarness(server).connector("bad", "events")
            c["nats"] |= nats
            connector = NatsConnector.model_validate(c)
            with pytest.raises(Exception) as e:
                asyncio.run(ensure_streams(connector))
            return str(e.value)

        assert refusal(url=wrong).endswith(
            ": it refused the credentials; check the user and password (or token) in nats.url"
        )
        assert refusal(user="weir", password="wrong").endswith(
            "; check nats.user and nats.password"
        )
        assert refusal().endswith(
            "; check nats.user and nats.password, token, nkey_seed_file or creds_file (none is "
            "given)"
        )


def test_nkey_auth(table: str, tmp_path: Path) -> None:
    """``nkey_seed_file`` signs in with the seed it holds (nats-py needs its nkeys extra, which
    Weir's install lacked: every such connector retried ModuleNotFoundError for ever); a seed
    file gone since the config was loaded is said as such."""
    import nkeys

    seed = nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(seed).public_key.decode()
    (tmp_path / "seed.nk").write_bytes(seed)
    (tmp_path / "nats.conf").write_text(f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}')
    with EmbeddedNats(args=["-c", str(tmp_path / "nats.conf")]) as server:
        c = NatsHarness(server, {"nkey_seed_file": str(tmp_path / "seed.nk")}).connector(
            "nk", "events"
        )
        connector = NatsConnector.model_validate(c)
        asyncio.run(ensure_streams(connector))
        with serving(weir_config(table, [c])):
            insert_t(table, range(1, 4))
            wait_for(lambda: cursor_of(table, "nk")[0] == 3, what="3 taken by JetStream")
        # A seed gone since the config was loaded is named, not taken for a server away.
        (tmp_path / "seed.nk").unlink()
        with pytest.raises(Exception, match="check the files under nats:") as e:
            asyncio.run(ensure_streams(connector))
        assert f": cannot read {tmp_path}/seed.nk: No such file or directory;" in str(e.value)


def test_nats_setup_creates_then_reports_differences(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    config = tmp_path / "weir.yaml"
    config.write_text(
        "store: {url: postgresql://unused@127.0.0.1/x}\n"
        "connectors:\n"
        "  - name: recs\n"
        "    type: nats\n"
        "    stream: records\n"
        f"    nats: {{url: '{nats_server.url}', records_stream: {{name: SETUP-RECORDS,"
        " subjects: ['setup-records.>'], max_msgs_per_subject: 1}}\n"
    )

    def setup() -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "core.cli", "nats", "setup", "--config", str(config)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    first = setup()
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "recs: created stream SETUP-RECORDS (setup-records.>)"
    assert setup().stdout.strip() == "recs: stream SETUP-RECORDS exists and matches"
    text = config.read_text()
    config.write_text(text.replace("max_msgs_per_subject: 1", "max_msgs_per_subject: 5"))
    assert setup().stdout.strip() == (
        "recs: stream SETUP-RECORDS exists but differs: max_msgs_per_subject is 1, recommended 5"
    )
