"""Findings of the Nov 29 (h) outside try-out (sources added by a change, cursors made before
the broker answers, configs read and sent back, config validate), against real servers: each
test states a promise of README.md / docs/ and fails on the code it was written against, as its
docstring tells."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.adversarial.test_tryout_nov29c_ops import (  # noqa: F401 (quickstart_pg: a fixture)
    _env,
    _quickstart_config,
    quickstart_pg,
)
from tests.adversarial.test_tryout_nov29g import _push, _sent
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers.api import api_serving, change
from tests.helpers.capture import wait_for
from tests.helpers.cli import weir
from tests.helpers.quickstart import ROLE


def _charges(hooks: WebhookHarness, c: dict[str, Any]) -> list[str]:
    return [rid for coll, rid in _sent(hooks, c) if coll == "charges"]


def test_a_source_removed_then_added_again_is_read_from_the_change_that_adds_it(
    table: str, webhook_receiver: Receiver
) -> None:
    """docs/operations.md “Management API and CLI”: "A **change** keeps the making: its
    shards go on from their cursors with the new config (a new destination gets what comes
    after them; a source the change adds is read from where its stream stood at the change, whatever
    ``start_position`` says)". A webhook connector of ``sources: [app]``; a change adds the
    http source ``stripe`` (charges 1-2 sent: that holds), a change takes it out again, charges
    3-4 come while the connector does not read ``stripe``, and a change adds it back; charges
    5-6 come after. The destination gets charges 3 and 4 too: the source added back is read
    from the cursor the first adding left (``api_connectors.added`` notes the heads of the
    latest change, but an old cursor of the source wins over it)."""
    hooks = WebhookHarness(webhook_receiver)
    c = hooks.connector("readd", "events", sources=["app"])
    hooks.prepare(c)
    with api_serving(table) as client:
        r = client.post("/v1/connectors", json=c)
        assert r.status_code == 201, r.text
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (1, 'a')")
        wait_for(lambda: _sent(hooks, c) == [("public:t", "1")], what="the connector to run")
        change(client, c, sources=["app", "stripe"])
        _push(client, range(1, 3))
        wait_for(lambda: _charges(hooks, c) == ["1", "2"], what="charges 1-2")  # holds
        change(client, c, sources=["app"])
        _push(client, range(3, 5))  # while the connector does not read stripe
        time.sleep(1)
        change(client, c, sources=["app", "stripe"])
        _push(client, range(5, 7))
        wait_for(lambda: "6" in _charges(hooks, c), what="charge 6")
        time.sleep(1)
    assert _charges(hooks, c) == ["1", "2", "5", "6"], _charges(hooks, c)


# --- secrets: a config read over the API and sent back round-trips ----------------------------


@pytest.mark.parametrize("as_list", [True, False], ids=["a-list", "its-one-url"])
def test_a_server_taken_out_of_a_nats_cluster_list_keeps_the_others_secrets(
    table: str, nats_server: EmbeddedNats, as_list: bool
) -> None:
    """docs/configuration.md “Secrets”: "a config read and sent back round-trips: a mask sent
    back where it was shown, in an object or a list (a NATS cluster's URLs), keeps the
    secret". A connector of a two-server cluster, ``url: [nats://u:pw-one@127.0.0.1:P,
    nats://u:pw-two@localhost:P]``, read back as ``[nats://u:***@127.0.0.1:P,
    nats://u:***@localhost:P]``. Taking the first server out of the list as read (a node
    decommissioned: ``[nats://u:***@localhost:P]``, the second URL exactly as it was shown)
    is refused: 422 ``body.nats.url.0: a masked value where a secret goes``; likewise
    the two swapped, or a new server put first. core/redact.py ``unmasked`` matches a list's
    masks by place only, so any change of the list but an append makes the user retype every
    password of the cluster. The same sent as ``url``'s one value (``url`` takes a URL or a
    list; the ninth tryout): 422 too."""
    port = nats_server.url.rsplit(":", 1)[1]
    one, two = f"nats://u:pw-one@127.0.0.1:{port}", f"nats://u:pw-two@localhost:{port}"
    c = {"name": "cluster", "type": "nats", "stream": "events", "nats": {"url": [one, two]}}
    with api_serving(table) as client:
        r = client.post("/v1/connectors", json=c)
        assert r.status_code == 201, r.text
        shown = client.get("/v1/connectors/cluster/config").json()["config"]
        masked_two = shown["nats"]["url"][1]
        assert masked_two == two.replace("pw-two", "***"), shown  # holds
        sent = [masked_two] if as_list else masked_two
        r = client.put("/v1/connectors/cluster",
                       json={**shown, "nats": {**shown["nats"], "url": sent}})  # fmt: skip
        assert r.status_code == 200, r.text
        with psycopg.connect(table) as conn:
            stored = conn.execute("SELECT config FROM weir.api_connectors WHERE name = 'cluster'"
                                  ).fetchone()[0]  # fmt: skip
        assert stored["nats"]["url"] == ([two] if as_list else two), stored


# --- first run: `weir config validate` tells what `weir run` will refuse ---------------------


def test_config_validate_names_a_role_that_may_not_replicate(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README “Quickstart”: "`weir config validate` checks the file, then asks the sources that
    answer what `weir run`'s start would: a refusal (a wrong password, a database that does
    not exist), a missing publication and a table of `tables:` it could not capture are errors
    (exit 2)"; and "What it cannot do it says in one line with the fix and exits 1 (a wrong
    password, a missing database, a role without the grant it needs: the line names the
    GRANT)". The quickstart's role without ``REPLICATION`` (``ALTER ROLE weir_cdc
    NOREPLICATION``, or a DBA who left it out of the CREATE ROLE): `weir run` stops at once,
    exit 1, ``source 'app-db': role weir_cdc may not create replication slot weir_slot (it has
    no REPLICATION): as a superuser, ALTER ROLE weir_cdc REPLICATION``; `weir config validate`
    says ``ok (1 sources, 1 connectors, 0 consumers)``, exit 0: the source answers, and the one
    refusal its start would meet is not asked (the systemd unit's ExecStartPre passes it)."""
    pg = quickstart_pg
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {ROLE} NOREPLICATION")
    config = _quickstart_config(tmp_path, nats_server.url)
    ran = weir("run", "--config", str(config), code=1, env=_env(pg), timeout=40)  # holds
    assert "ALTER ROLE weir_cdc REPLICATION" in ran, ran[-2000:]
    out = weir("config", "validate", str(config), code=None, env=_env(pg))
    assert "REPLICATION" in out and "ok (" not in out, out


def test_config_validate_names_a_publication_weir_cannot_create(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README “Quickstart”: validate "asks the sources that answer what `weir run`'s start
    would: a refusal ..., a missing publication and a table of `tables:` it could not capture
    are errors (exit 2)". The quickstart's source with ``create_publication: true`` (the
    default, when a user leaves the line out) and ``publication: weir_pub2``, which does not
    exist: the role does not own the tables, so `weir run` stops at once (exit 1: ``source
    'app-db': role weir_cdc cannot create publication weir_pub2 (permission denied for
    database app): as the tables' owner run CREATE PUBLICATION ...``), while `weir config
    validate` says ``ok (1 sources, 1 connectors, 0 consumers)``, exit 0: the missing
    publication is checked only with ``create_publication: false``."""
    pg = quickstart_pg
    config = _quickstart_config(tmp_path, nats_server.url, create_publication=True,
                                publication="weir_pub2")  # fmt: skip
    ran = weir("run", "--config", str(config), code=1, env=_env(pg), timeout=40)  # holds
    assert "cannot create publication weir_pub2" in ran, ran[-2000:]
    out = weir("config", "validate", str(config), code=None, env=_env(pg))
    assert "weir_pub2" in out and "ok (" not in out, out
