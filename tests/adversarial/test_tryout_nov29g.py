"""Findings of the Nov 29 (g) outside try-out (connector lifecycle, ingest, first run, secrets,
shutdown), against real servers: each test states a promise of README.md / docs/ and fails on
the code it was written against, as its docstring tells."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.adversarial.test_tryout_nov29c_ops import (  # noqa: F401 (quickstart_pg: a fixture)
    _env,
    _quickstart_config,
    quickstart_pg,
)
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers.api import api_serving, change
from tests.helpers.capture import wait_for
from tests.helpers.cli import running, weir
from tests.helpers.quickstart import PASSWORD, ROLE
from tests.helpers.quickstart import db_url as _db


def _round_trip(client: httpx.Client, connector: dict[str, Any]) -> httpx.Response:
    """Make ``connector`` over the API, read its config back and send that back unchanged."""
    r = client.post("/v1/connectors", json=connector)
    assert r.status_code == 201, r.text
    shown = client.get(f"/v1/connectors/{connector['name']}/config").json()["config"]
    return client.put(f"/v1/connectors/{connector['name']}", json=shown)


# --- secrets: a config read over the API and sent back round-trips ----------------------------


def test_a_nats_cluster_url_list_read_over_the_api_and_sent_back_round_trips(
    table: str, nats_server: EmbeddedNats
) -> None:
    """docs/configuration.md “Secrets”: "By field, in a config the management API shows: secret
    fields are ``**********``, every other value as it is (URL passwords by shape), so a config
    read and sent back round-trips". ``nats.url`` may be a list of a cluster's servers
    (“Keys”: ``text | [text]``). With one URL holding ``user:password@`` the GET and PUT
    round-trip (200); with a LIST of such URLs, the GET shows ``nats://u:***@…`` for each and
    the same body PUT back is refused: 422 ``body.nats.url.0: a masked value where a secret
    goes`` (core/redact.py ``unmasked`` puts masks back inside objects, never inside lists).
    So a connector of a NATS cluster with credentials in its URLs cannot be changed by
    read-modify-write; a user has to retype every password."""
    port = nats_server.url.rsplit(":", 1)[1]
    url = f"nats://u:pw-of-the-cluster@127.0.0.1:{port}"
    with api_serving(table) as client:
        one = _round_trip(client, {"name": "one", "type": "nats", "stream": "events",
                                   "nats": {"url": url}})  # fmt: skip
        assert one.status_code == 200, one.text  # holds
        many = _round_trip(client, {"name": "many", "type": "nats", "stream": "events",
                                    "nats": {"url": [url, url]}})  # fmt: skip
        assert many.status_code == 200, many.text
        stored = client.get("/v1/connectors/many/config").json()["config"]["nats"]["url"]
        assert stored == [url.replace("pw-of-the-cluster", "***")] * 2, stored


def test_text_that_is_no_secret_is_shown_as_it_is_and_round_trips(
    table: str, webhook_receiver: Receiver
) -> None:
    """docs/configuration.md “Secrets”: in a config the management API shows "every other value
    [is] as it is (URL passwords by shape), so a config read and sent back round-trips"; and
    docs/design.md: "nothing else is masked". A filter comparing a column with the text
    ``token=plain`` and a transform step adding ``see token=abc`` (data, no secret) are shown
    by ``GET /v1/connectors/{name}/config`` as ``token=***`` and ``see token=***``, and the
    config PUT back as read is refused: 422 ``body.filters.0.value: a masked value where a
    secret goes`` (``body.steps.0.transform.add.note`` for the step). The filter cannot be
    read back, and the connector cannot be changed by read-modify-write."""
    hook = f"{webhook_receiver.url}/hooks/nosecret"
    filt = {"name": "filt", "type": "webhook", "stream": "events", "webhook": {"url": hook},
            "filters": [{"column": "body", "op": "=", "value": "token=plain"}]}  # fmt: skip
    step = {"name": "step", "type": "webhook", "stream": "events", "webhook": {"url": hook},
            "steps": [{"transform": {"add": {"note": "see token=abc"}}}]}  # fmt: skip
    with api_serving(table) as client:
        problems = []
        for c in (filt, step):
            r = _round_trip(client, c)
            if r.status_code != 200:
                problems.append(f"{c['name']}: PUT of what was read: {r.status_code} {r.text}")
            shown = client.get(f"/v1/connectors/{c['name']}/config").json()["config"]
            if "***" in str(shown.get("filters")) + str(shown.get("steps")):
                problems.append(f"{c['name']}: shown {shown['filters']} {shown['steps']}")
        assert not problems, problems


# --- the connector lifecycle over the management API ------------------------------------------


def _push(client: httpx.Client, ids: range) -> None:
    r = client.post(
        "/v1/sources/stripe/records",
        json={
            "records": [
                {"collection_id": "charges", "record_id": str(i), "data": {"v": i}} for i in ids
            ]
        },
    )
    assert r.status_code == 200, r.text


def _sent(hooks: WebhookHarness, c: dict[str, Any]) -> list[tuple[str, str]]:
    return [(d.payload["metadata"]["collection_id"], d.payload["metadata"]["record_id"])
            for d in hooks.read(c)]  # fmt: skip


def test_a_source_added_by_a_change_applies_from_the_change_on(
    table: str, webhook_receiver: Receiver
) -> None:
    """docs/operations.md “Management API and CLI”: ``PUT /v1/connectors/{name}`` "restarts its
    shards from their cursors (new ``collections`` or ``sources`` apply from there on)"; “A
    change”: "a new destination gets what comes after them". A webhook connector made with
    ``sources: [app]`` and ``start_position: end``; the http source ``stripe`` then takes
    charges 1-3 (the connector does not read it); a change adds ``stripe``; charges 4-5 come
    after. The destination gets charges 1, 2 and 3 too: what the source held before the
    change is sent, as if the added source had been read since the making (with
    ``beginning`` its whole history). A new collection, by contrast, applies from the change on
    (its changes before it are behind the cursor)."""
    hooks = WebhookHarness(webhook_receiver)
    c = hooks.connector("added", "events", sources=["app"], start_position="end")
    hooks.prepare(c)
    with api_serving(table) as client:
        r = client.post("/v1/connectors", json=c)
        assert r.status_code == 201, r.text
        _push(client, range(1, 4))  # before the change: not the connector's then
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (1, 'a')")
        wait_for(lambda: _sent(hooks, c) == [("public:t", "1")], what="the connector to run")
        change(client, c, sources=["app", "stripe"])
        _push(client, range(4, 6))
        wait_for(lambda: ("charges", "5") in _sent(hooks, c), what="charge 5")
        time.sleep(1)
    charges = [rid for coll, rid in _sent(hooks, c) if coll == "charges"]
    assert charges == ["4", "5"], charges


# --- first run: `weir config validate` tells what `weir run` will refuse ---------------------


def test_config_validate_names_a_publication_that_cannot_capture_the_tables(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README “Quickstart”: "`weir config validate` checks the file, then asks the sources that
    answer what `weir run`'s start would: a table of `tables:` it could not capture is an error
    (exit 2)". With ``create_publication: false`` (as the quickstart writes it) and
    ``publication:`` naming one the DBA did not make (``weir_pubx``), `weir run` stops at once
    (exit 1: ``publication 'weir_pubx' does not exist and create_publication is false: CREATE
    PUBLICATION it, or let Weir create it``), but `weir config validate` says ``ok (1
    sources, 1 connectors, 0 consumers)``, exit 0. Likewise a publication holding
    ``public.users`` only: `weir run` warns ``not capturing public.orders: not in publication
    pub_users ...: ALTER PUBLICATION ...`` and runs without it, while validate says ``ok``. The
    systemd unit runs validate first (ExecStartPre), so the mistake passes it."""
    pg = quickstart_pg
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("SET ROLE app")
        conn.execute("CREATE PUBLICATION pub_users FOR TABLE public.users")
    problems = []
    # validate says what run's start would: it stops on a missing publication (an error, exit
    # 2), and warns of a table the publication leaves out (it runs without it until a DBA adds
    # it, then backfills it): a warning naming the table and the fix
    cases = (("weir_pubx", "publication 'weir_pubx' does not exist", 2),
             ("pub_users", "warning: source app-db: not capturing public.orders: not in "
              "publication pub_users", 0))  # fmt: skip
    for publication, said, code in cases:
        where = tmp_path / publication
        where.mkdir()
        config = _quickstart_config(where, nats_server.url, publication=publication)
        out = weir("config", "validate", str(config), code=None, env=_env(pg))
        if said not in out or (code == 2) == ("ok (" in out):
            problems.append(f"publication {publication}: {out.strip()}")
    assert not problems, problems


def test_config_validate_names_a_database_that_does_not_exist_or_a_wrong_password(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """Same promise: validate "asks the sources that answer what `weir run`'s start would" ("a
    source that does not answer is left to the start"). A typo in the URL's database
    (``/ap``), or a wrong password: the server answers (``database "ap" does not exist``,
    ``password authentication failed``) and `weir run` ends at once, exit 1, with one line
    (``cannot reach source app-db at ...: database "ap" does not exist; check the database and
    user names of its url``); `weir config validate` says ``ok (1 sources, 1 connectors, 0
    consumers)``, exit 0 (core/sources/pg/selected.py ``catalog_problems`` passes over every
    ``psycopg.Error``, not only a source that does not answer)."""
    pg = quickstart_pg
    config = _quickstart_config(tmp_path, nats_server.url)
    problems = []
    for app, said in ((_db(pg, "ap", ROLE, PASSWORD), '"ap" does not exist'),
                      (_db(pg, "app", ROLE, "wrong-one"), "password")):  # fmt: skip
        env = _env(pg, app=app)
        weir("run", "--config", str(config), code=1, env=env, timeout=30)  # holds: exit 1
        out = weir("config", "validate", str(config), code=None, env=env)
        if said not in out or "ok (" in out:
            problems.append(out.strip())
    assert not problems, problems


# --- monitoring: a connector whose broker is down from its first start ------------------------


def test_a_connector_that_never_reached_its_broker_is_shown_behind(
    tmp_path: Path, table: str
) -> None:
    """docs/operations.md “Monitoring”: "A connector's ``BEHIND`` is how many messages the store
    holds that it has not yet sent ... and ``BEHIND BY`` how long ago the oldest of them was
    stored: 0 and 0.0s when it is caught up" (the API's ``lag_messages``/``lag_seconds``,
    ``/metrics``' ``weir_cursor_lag_messages``). A NATS connector whose server is not up yet
    (``connection refused``, retried: a transient error) has sent none of the 5 changes the
    store holds, yet `weir status` shows it caught up: ``dead  connecting  -  events  0
    0.0s ...`` and the API ``"lag_messages": 0, "lag_seconds": 0.0, "seq": 0``. A webhook
    connector whose receiver is down shows ``BEHIND 5`` (that holds). An alert on lag never
    fires for a connector that has not delivered anything since its first start (a new
    deploy with a wrong broker address)."""
    token = "a-token-of-24-characters"
    port = free_port()
    spec = {"sources": [{"name": "app", "kind": "postgres", "url": table,
                         "tables": ["public.t"]}],
            "api": {"listen": f"127.0.0.1:{port}", "tokens": [token]},
            "connectors": [
                {"name": "dead", "type": "nats", "stream": "events",
                 "nats": {"url": f"nats://127.0.0.1:{free_port()}"}},
                {"name": "hook", "type": "webhook", "stream": "events",
                 "webhook": {"url": f"http://127.0.0.1:{free_port()}/x"}}]}  # fmt: skip
    with running(tmp_path, spec, token) as (client, config):
        with psycopg.connect(table, autocommit=True) as conn:
            for i in range(5):
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))

        def lag(name: str) -> int:
            return int(client.get(f"/v1/connectors/{name}").json()["shards"][0]["lag_messages"])

        wait_for(lambda: lag("hook") == 5, timeout=30, what="the webhook's lag")  # holds
        time.sleep(3)
        dead = client.get("/v1/connectors/dead").json()["shards"][0]
        status = weir("status", "--config", str(config))
    row = next(line for line in status.splitlines() if line.startswith("dead "))
    assert dead["lag_messages"] == 5, (dead, row)
