"""Findings of the Nov 29 outside try-out, against real servers: each test is a promise of
README.md / docs/ that the try-out found broken, as its docstring tells what was seen; each
passes since its fix (the commits that cite the try-out)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.conftest import fresh_database
from tests.helpers import stored
from tests.helpers.api import TOKEN, api_serving
from tests.helpers.capture import wait_for
from tests.helpers.cli import running, weir
from tests.helpers.weir import serving, weir_config


def _push(client: httpx.Client, *recs: dict[str, object]) -> httpx.Response:
    return client.post("/v1/sources/stripe/records", json={"records": list(recs)})


def test_ingest_far_future_upstream_updated_at_is_a_422_not_a_500(db_url: str) -> None:
    """docs/consume-api.md: every ingest body is refused with a 422 naming what is wrong, or
    taken. ``upstream_updated_at`` of 9999-12-31T23:59:59-14:00 is a valid ISO-8601 time with
    a zone (pydantic takes it) but lies past year 9999 in UTC: ``utc_iso`` overflows and the
    API answers 500 Internal Server Error (and drops the keep-alive connection)."""
    with api_serving(db_url) as client:
        r = _push(client, {"collection_id": "c", "record_id": "1", "data": {"a": 1},
                           "upstream_updated_at": "9999-12-31T23:59:59-14:00"})  # fmt: skip
        assert r.status_code == 422 and "upstream_updated_at" in r.text, (r.status_code, r.text)


def test_ingest_older_upstream_updated_at_later_in_a_batch_does_not_overwrite(
    db_url: str,
) -> None:
    """docs/consume-api.md: "a record is written only when its version is newer than the
    stored one" (an older version never overwrites a newer one), and a record listed twice in
    a batch is newer the second time only for "the same time of ingest, or an equal
    upstream_updated_at". Pushed in one batch as 2026 then 2020, the 2020 version is taken as
    newer (accepted 2) and the record ends as the older data; pushed in two batches, the same
    2020 version is skipped. The outcome depends on how a sync happened to batch."""
    one = {"collection_id": "c", "record_id": "1"}
    two = {"collection_id": "c", "record_id": "2"}
    new = "2026-01-01T00:00:00Z"
    old = "2020-01-01T00:00:00Z"
    with api_serving(db_url) as client:
        # two batches: the older one is skipped
        assert _push(client, {**one, "data": {"v": "new"}, "upstream_updated_at": new}).json() == {
            "accepted": 1,
            "skipped": 0,
        }
        assert _push(client, {**one, "data": {"v": "old"}, "upstream_updated_at": old}).json() == {
            "accepted": 0,
            "skipped": 1,
        }
        # one batch: the same two pushes
        got = _push(client, {**two, "data": {"v": "new"}, "upstream_updated_at": new},
                    {**two, "data": {"v": "old"}, "upstream_updated_at": old})  # fmt: skip
        latest = {r["record_id"]: json.loads(r["record_json"]) for r in stored.records(db_url)}
        assert latest["1"] == {"v": "new"}
        assert (got.json(), latest["2"]) == ({"accepted": 1, "skipped": 1}, {"v": "new"}), (
            got.text,
            latest,
        )


@contextmanager
def sql_ascii_database(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A new SQL_ASCII database (a legacy one) on ``pg_server``; dropped after, with its slots."""
    with fresh_database(pg_server) as other:
        name = other.rsplit("/", 1)[1] + "a"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C'"
                     " LC_CTYPE 'C' TEMPLATE template0")  # fmt: skip
    try:
        yield pg_server.url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(pg_server.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(active_pid, 10000) FROM"
                         " pg_replication_slots WHERE database = %s AND active_pid IS NOT"
                         " NULL", (name,))  # fmt: skip
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM"
                         " pg_replication_slots WHERE database = %s", (name,))  # fmt: skip
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _legacy(url: str, *statements: bytes) -> None:
    """Statements as a SQL_ASCII client sends them: their bytes as the database keeps them."""
    with psycopg.connect(url, autocommit=True, client_encoding="SQL_ASCII") as conn:
        for statement in statements:
            conn.execute(statement)


def test_a_legacy_table_name_in_a_sql_ascii_database_does_not_stop_weir(
    pg_server: EmbeddedPostgres, db_url: str
) -> None:
    """A SQL_ASCII database (a legacy one) whose followed schema holds a table named in
    Latin-1 bytes (``café``: 0xE9, no UTF-8). docs/configuration.md: a table of a followed
    schema that cannot be captured "is logged and left out, so the user's writes never fail";
    docs/design.md: text no UTF-8 client can read arrives as its bytes, one Latin-1 character
    a byte. Made while Weir runs, the table is even captured (as ``public:café``); but at the
    next start (and at any first start) listing the schema's tables with client_encoding UTF8
    fails, and ``weir run`` exits 1 saying only ``source app: invalid byte sequence for
    encoding "UTF8": 0xe9``, naming neither the table nor a fix, and captures nothing of the
    schema's other tables."""
    with sql_ascii_database(pg_server) as url:
        _legacy(url, b"CREATE TABLE good (id int PRIMARY KEY, v text)",
                b"CREATE TABLE caf\xe9 (id int PRIMARY KEY, v text)")  # fmt: skip
        with serving(weir_config(url, [], store={"url": db_url})):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("INSERT INTO good VALUES (1, 'a')")
            wait_for(lambda: stored.record(db_url, "public:good", "1") is not None,
                     what="the good table's row")  # fmt: skip


def test_a_misspelt_table_beside_a_legacy_name_is_named_in_one_line(
    tmp_path: Path, pg_server: EmbeddedPostgres, db_url: str
) -> None:
    """A review of the closest-name hint: ``tables: [public.god]`` in a SQL_ASCII database
    that also holds a Latin-1 table name (``caf\xe9``). Listing every table for the closest
    name read the legacy name too, so the one line naming the fix became ``invalid byte
    sequence for encoding "UTF8": 0xe9``. The legacy name is no candidate; the readable one
    is."""
    with sql_ascii_database(pg_server) as url:
        _legacy(url, b"CREATE TABLE good (id int PRIMARY KEY, v text)",
                b"CREATE TABLE caf\xe9 (id int PRIMARY KEY, v text)")  # fmt: skip
        config = tmp_path / "weir.yaml"
        config.write_text(json.dumps({
            "store": {"url": db_url}, "connectors": [],
            "sources": [{"name": "app", "kind": "postgres", "url": url,
                         "tables": ["public.god"]}]}))  # fmt: skip
        out = weir("run", "--config", str(config), code=1, timeout=30)
    assert "invalid byte sequence" not in out and "Traceback" not in out, out
    assert "table public.god does not exist" in out and "did you mean 'public.good'?" in out, out


def test_adding_a_legacy_named_column_in_a_sql_ascii_database_does_not_stop_capture(
    pg_server: EmbeddedPostgres, db_url: str
) -> None:
    """docs/configuration.md: with a superuser, a table whose columns change (ADD COLUMN) is
    backfilled, and DDL cannot take capture down. In a SQL_ASCII database, ``ALTER TABLE t
    ADD COLUMN "d\xe9f" text DEFAULT 'z'`` (a Latin-1 column name) while Weir runs stops
    capture for good: ``ERROR weir: source app: invalid byte sequence for encoding "UTF8":
    0xe9``, the source worker exits 1 ("failed for good; stopping every worker"), and every
    restart exits 1 the same way within a second of streaming. (A table created with such a
    column name is captured fine: ``{"id": 1, "n\xe9": "x"}``.)"""
    with sql_ascii_database(pg_server) as url:
        _legacy(url, b"CREATE TABLE t (id int PRIMARY KEY, v text)")
        with serving(weir_config(url, [], store={"url": db_url})):
            _legacy(url, b"INSERT INTO t VALUES (1, 'a')")
            wait_for(lambda: stored.record(db_url, "public:t", "1") is not None,
                     what="the first row")  # fmt: skip
            _legacy(url, b"ALTER TABLE t ADD COLUMN \"d\xe9f\" text DEFAULT 'z'",
                    b"INSERT INTO t VALUES (2, 'b')")  # fmt: skip
            wait_for(lambda: stored.record(db_url, "public:t", "2") is not None,
                     timeout=30, what="the row after the ALTER")  # fmt: skip
        got = stored.record(db_url, "public:t", "2")
        assert got is not None and json.loads(got["record_json"]) == {
            "id": 2, "v": "b", "d\xe9f": "z"}  # fmt: skip


def _with_password(url: str, password: str) -> str:
    """``url`` (the embedded server trusts every login) with ``password`` for its user."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@", 1)


def test_config_validate_keeps_the_allowed_values_a_weak_password_spells(tmp_path: Path) -> None:
    """docs/configuration.md “Secrets”: Weir's own words (its own error messages) and what is
    no secret are never masked, "also when a password is the same word". With a source
    password that is an ordinary word of the config's vocabulary (``postgres``, as on many a
    dev box; ``events``; ``beginning``), ``weir config validate`` masks the word in the list of
    allowed values, so the one line meant to name the fix hides it:
    ``Input tag 'postgre' ... does not match any of the expected tags: '***', 'http'``;
    ``stream: Input should be 'records' or '***'``; Weir's own
    ``start_position: expected ***, end, {seq: N} or {time: ISO-8601}``; and pydantic's
    ``unable to parse string as an integer`` becomes ``unable to parse *** as an integer``
    with the password ``string``. The password itself is in no message."""
    cases = {
        "postgres": ("{name: app, kind: postgre, url: 'postgresql://u:postgres@h/db'}", "[]",
                     "'postgres', 'http'"),
        "events": ("{name: app, kind: postgres, url: 'postgresql://u:events@h/db'}",
                   "[{name: n, type: nats, stream: event}]", "'records' or 'events'"),
        "beginning": ("{name: app, kind: postgres, url: 'postgresql://u:beginning@h/db'}",
                      "[{name: n, type: nats, stream: events, start_position: begining}]",
                      "expected beginning, end"),
        "string": ("{name: app, kind: postgres, url: 'postgresql://u:string@h/db'}",
                   "[{name: n, type: nats, stream: events, max_in_flight: abc}]",
                   "unable to parse string as an integer"),
    }  # fmt: skip
    wrong = {}
    for password, (source, connectors, expected) in cases.items():
        config = tmp_path / f"{password}.yaml"
        config.write_text(f"sources: [{source}]\nconnectors: {connectors}\n")
        out = weir("config", "validate", str(config), code=2)
        if expected not in out:
            wrong[password] = out.strip()
    assert not wrong, wrong


def _api_spec(db_url: str, password: str) -> dict[str, Any]:
    return {"api": {"listen": f"127.0.0.1:{free_port()}", "tokens": [TOKEN]},
            "sources": [{"name": "app", "kind": "postgres", "schemas": ["public"],
                         "url": _with_password(db_url, password)}],
            "connectors": []}  # fmt: skip


def test_api_refusals_keep_the_allowed_values_a_weak_password_spells(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """The same over the management API (docs/operations.md: "validated by the same models as
    the file (422 names the field)"): with the source's password ``records``, a connector or
    consumer sent with ``stream: record`` gets ``Input should be '***' or 'events'``: the
    value to send is masked, though it is in the API's own schema (/openapi.json)."""
    with running(tmp_path, _api_spec(db_url, "records"), TOKEN) as (client, _):
        r = client.post("/v1/connectors", json={"name": "x", "type": "nats", "stream": "record",
                                                "nats": {"url": nats_server.url}})  # fmt: skip
        c = client.post("/v1/http-consumers", json={"name": "y", "stream": "record"})
    assert (r.status_code, c.status_code) == (422, 422), (r.text, c.text)
    assert "'records' or 'events'" in r.text, r.text
    assert "'records' or 'events'" in c.text, c.text


def test_log_lines_keep_the_name_of_a_connector_made_over_the_api(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """docs/configuration.md “Secrets”: the names a log line carries (a connector's name) are
    never masked, also when a password is the same word. A connector made over the API is
    not in the file, so its name is not known as one: with the source's password ``records``,
    the connector ``records`` (collections ``public:records``) is logged as
    ``connector ***: made over the API``, ``connector ***: collections: 'public:***' matches
    none ...`` and ``connector ***: deleted over the API``, while the API's own answer says
    ``public:records`` plainly."""
    with running(tmp_path, _api_spec(db_url, "records"), TOKEN) as (client, _):
        r = client.post("/v1/connectors", json={
            "name": "records", "type": "nats", "stream": "records",
            "collections": ["public:records"], "nats": {"url": nats_server.url}})  # fmt: skip
        assert r.status_code == 201, r.text
        assert client.delete("/v1/connectors/records").status_code == 200
    text = (tmp_path / "run.log").read_text()
    lines = [line for line in text.splitlines() if "weir.manage" in line]
    assert any("connector records: made over the API" in line for line in lines), lines
    assert not [line for line in lines if "***" in line], lines


def _headers(page: str, first: str) -> list[str]:
    """The column names of the console table whose first column is ``first``."""
    for head in re.findall(r"<thead><tr>(.*?)</tr></thead>", page, re.S):
        names = [html.unescape(h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", head)]
        if names and names[0] == first:
            return names
    raise AssertionError(f"no table of {first} in the console")


def test_the_console_names_its_columns_as_weir_status_does(tmp_path: Path, db_url: str) -> None:
    """docs/operations.md “Monitoring” defines `weir status`'s BEHIND, BEHIND BY (a connector)
    and QUEUED, UNACKED (a consumer's queue), and the console's Spark table already says
    Behind / Behind by; but the console's connector table calls the same numbers Lag and
    Oldest, and its consumer table Pending and Awaiting ack, so an operator who reads one and
    greps the other finds nothing. The connector and consumer tables of both should use one
    set of words."""
    port = free_port()
    spec = {"api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]},
            "sources": [{"name": "app", "kind": "postgres", "url": db_url,
                         "schemas": ["public"]}],
            "consumers": [{"name": "w", "stream": "events"}],
            "connectors": [{"name": "hooks", "type": "webhook", "stream": "events",
                            "webhook": {"url": "http://127.0.0.1:9/"}}]}  # fmt: skip
    with running(tmp_path, spec, TOKEN) as (api, _):
        config = tmp_path / "weir.yaml"
        status = weir("status", "--config", str(config))
        with httpx.Client(base_url=api.base_url, timeout=30) as client:
            assert client.post("/console/login", data={"token": TOKEN}).status_code == 303
            page = client.get("/console").text
    tables = [line.split("  ") for line in status.splitlines() if line[:1].isupper()]
    columns = {row[0]: {c.strip().lower() for c in row if c.strip()} for row in tables}
    console_connectors = {h.lower() for h in _headers(page, "Connector")}
    console_consumers = {h.lower() for h in _headers(page, "Consumer")}
    missing = {"connectors": sorted({"behind", "behind by"} & columns["CONNECTOR"]
                                    - console_connectors),
               "consumers": sorted({"queued", "unacked"} & columns["CONSUMER"]
                                   - console_consumers)}  # fmt: skip
    assert missing == {"connectors": [], "consumers": []}, (
        missing,
        sorted(console_connectors),
        sorted(console_consumers),
    )
