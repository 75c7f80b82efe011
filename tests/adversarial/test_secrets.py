"""Secrets, both ways (docs/configuration.md “Secrets”): random secrets planted in every config
field that can hold one never appear in anything a user sees (the log of ``weir -v run``, API
bodies, the console, ``weir config validate``, ``weir status``, ``weir failed list|show``), also
when a webhook receiver answers 401 echoing the headers it was sent; and what is no secret is never
masked: names, namespaces, log lines and values that hold a secret's letters stay readable,
and a config read over the API and sent back round-trips.

A secret "appears" when one of its spellings (raw, percent-encoded, JSON- or repr-escaped,
HTML-escaped, base64 of ``user:password`` as Basic auth sends it) occurs not adjoining a word
character on a side where the secret itself ends in one: the policy of core/redact.py.
"""

from __future__ import annotations

import ast
import base64
import html
import json
import re
import string
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from core.redact import MASK
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.conftest import fresh_database
from tests.helpers.capture import wait_for
from tests.helpers.cli import running, weir

RIGHT = "the-right-one-42"  # what the NATS server takes; every secret planted is wrong
HOOK_USER = "hookuser"

_SPECIAL = "%@:/?#&=+*.^$|()[]{}\\'\"-_~!;, "


def _own_words() -> frozenset[str]:
    """The string constants of Weir's code. Hypothesis draws text from a program's constants
    too, and a secret made one of Weir's own words (the allowed value ``SCRAM-SHA-256``) is
    printed where Weir names that value, as its own word (never masked, docs/configuration.md),
    not as the secret: such a draw tests nothing."""
    words = set()
    root = Path(__file__).resolve().parents[2]
    for path in [*(root / "core").rglob("*.py"), *(root / "connectors").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                words.add(node.value)
    return frozenset(words)


OWN_WORDS = _own_words()


def _secrets(count: int, min_size: int, newlines: bool = True) -> st.SearchStrategy[list[str]]:
    """Distinct secrets with a letter and a digit (so that no word of Weir's own output is one
    by chance), short ones included, with regex and URL specials, quotes and newlines."""
    alphabet = string.ascii_letters + string.digits + _SPECIAL + ("\n" if newlines else "")
    one = st.text(alphabet, min_size=min_size, max_size=min_size + 14).filter(
        lambda s: (
            s == s.strip()
            and bool(re.search("[A-Za-z]", s) and re.search("[0-9]", s))
            and s not in OWN_WORDS
        )
    )
    return st.lists(one, min_size=count, max_size=count, unique=True)


def spellings(secret: str) -> set[str]:
    js = json.dumps(secret)[1:-1]
    return {secret, quote(secret, safe=""), js, repr(secret)[1:-1], html.escape(secret),
            html.escape(js)}  # fmt: skip


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def found(secrets: list[str], text: str) -> list[str]:
    """Where the spellings of ``secrets`` appear in ``text`` (see the module's docstring): each
    with the text around it."""
    out = []
    for form in {f for s in secrets for f in spellings(s)}:
        left = r"(?<!\w)" if re.match(r"\w", form[0]) else ""
        right = r"(?!\w)" if re.match(r"\w", form[-1]) else ""
        for m in re.finditer(left + re.escape(form) + right, text):
            out.append(f"{form!r} in {text[max(0, m.start() - 300) : m.end() + 100]!r}")
    return out


def with_password(url: str, user: str, password: str) -> str:
    u = urlsplit(url)
    return f"postgresql://{user}:{quote(password, safe='')}@{u.hostname}:{u.port}{u.path}"


class Echo:
    """A webhook receiver that answers every request 401 with the headers it was sent and the
    credentials of its ``Authorization`` alone (as careless receivers do), and ``body`` when
    given instead."""

    def __init__(self, body: str | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                sent = dict(self.headers.items())
                scheme_and_token = self.headers.get("authorization", "").split(" ", 1)
                text = body if body is not None else json.dumps(
                    {"token": scheme_and_token[-1], **sent})  # fmt: skip
                self.send_response(401)
                self.send_header("content-length", str(len(text.encode())))
                self.end_headers()
                self.wfile.write(text.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Echo:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def failed_entries(client: httpx.Client, name: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/connectors/{name}/failed")
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


@pytest.fixture(scope="module")
def guarded_nats() -> Iterator[EmbeddedNats]:
    with EmbeddedNats(args=["--user", "natsuser", "--pass", RIGHT]) as server:
        yield server


@pytest.fixture(scope="module")
def secrets_db(pg_server: EmbeddedPostgres) -> Iterator[str]:
    with fresh_database(pg_server) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id serial PRIMARY KEY, body text)")
        yield url


def broken_connectors(s: list[str]) -> list[dict[str, Any]]:
    """Connectors with 8 secrets, each with a mistake near it: URLs and URL-ish strings that
    do not parse (``nats//user:pass@host``, a password written raw and followed by a quote,
    which ends a URL in text), a header value with a line break."""
    return [
        {"name": "n1", "type": "nats", "stream": "events",
         "nats": {"url": f'nats//natsuser:{s[0]}"@127.0.0.1:4222'}},
        {"name": "n2", "type": "nats", "stream": "events",
         "nats": {"url": [f"nast://u:{quote(s[1], safe='')}@h:4222"], "token": s[2], "user": "u"}},
        {"name": "k", "type": "kafka", "stream": "events",
         "kafka": {"bootstrap_servers": f'u:{s[3]}"@h:9092',
                   "sasl": {"mechanism": "BOGUS", "username": "u", "password": s[4]}}},
        {"name": "s", "type": "sqs", "stream": "events",
         "sqs": {"queue_url": f'htps://u:{s[5]}"@sqs/1/q', "secret_access_key": s[6]}},
        {"name": "w", "type": "webhook", "stream": "events",
         "webhook": {"url": "https://hooks.example.com/x", "bogus": 1,
                     "headers": {"Authorization": f"Bearer {s[7]}\n"}}},
    ]  # fmt: skip


def test_config_validate_prints_no_secret(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every field that can hold a secret, each with a mistake near it."""

    @settings(max_examples=4, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])  # fmt: skip
    @given(_secrets(12, 2))
    def check(s: list[str]) -> None:
        spec = {
            "store": {"url": f"postgresql://weir:{s[0]}@127.0.0.1:5432/app"},
            "api": {"tokens": [s[1][:15]]},  # too short: named, not shown
            "sources": [
                {"name": "a", "kind": "postgres", "url": f"oops host=h password={s[2]}",
                 "tables": ["public.t"]},
                {"name": "b", "kind": "postgres", "tables": ["public.t"],
                 "url": f"postgresql://weir:{quote(s[3], safe='')}@h/db", "slot": "Bad-Slot"},
            ],
            "connectors": broken_connectors(s[4:12]),
        }  # fmt: skip
        path = tmp_path_factory.mktemp("validate") / "weir.yaml"
        path.write_text(json.dumps(spec))
        out = weir("-v", "config", "validate", str(path), code=2)
        named = ("api.tokens", "sources[0].url", "sources[1].slot", "connectors[0].nats.url",
                 "connectors[1].nats.url", "connectors[2].kafka", "connectors[3].sqs.queue_url",
                 "connectors[4].webhook.headers.Authorization",  # a line break no header can carry
                 "connectors[4].webhook.bogus")  # fmt: skip
        assert all(f"weir.yaml:1: {key}" in out for key in named), out  # every mistake is named
        assert not found([*s, s[1][:15]], out), found([*s, s[1][:15]], out)

    check()


def test_no_secret_in_anything_a_user_sees(
    tmp_path_factory: pytest.TempPathFactory, secrets_db: str, guarded_nats: EmbeddedNats
) -> None:
    """A running Weir with a secret in every field that holds one: webhooks whose receiver
    answers 401 echoing the headers (a bearer token, an API key, Basic auth from the URL),
    NATS refusing a password, a token and a URL's password, Kafka and SQS nobody answers for;
    then everything a user reads, and the 422s of connectors posted with secrets and mistakes."""

    @settings(max_examples=1, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])  # fmt: skip
    @given(_secrets(21, 2), _secrets(1, 16, newlines=False), _secrets(3, 2, newlines=False))
    def check(s: list[str], token: list[str], header: list[str]) -> None:
        tmp = tmp_path_factory.mktemp("run")
        nats_url = f"nats://127.0.0.1:{guarded_nats.port}"
        retry = {"initial": "10ms", "max_attempts": 1}

        def connector(name: str, kind: str, settings: dict[str, Any]) -> dict[str, Any]:
            return {"name": name, "type": kind, "stream": "events", "retry": retry, kind: settings}

        with Echo() as echo:
            spec = {
                "api": {"listen": f"127.0.0.1:{free_port()}", "tokens": token},
                "store": {"url": with_password(secrets_db, "postgres", s[0])},
                "sources": [{"name": "app", "kind": "postgres", "tables": ["public.t"],
                             "url": with_password(secrets_db, "postgres", s[1]),
                             "slot": "planted"}],
                "connectors": [
                    connector("hooks", "webhook", {
                        "url": f"{echo.url}/x", "secret": s[2],
                        "headers": {"Authorization": f"Bearer {header[0]}",
                                    "X-Api-Key": header[1]}}),
                    connector("hooks-basic", "webhook", {
                        "url": f"http://{HOOK_USER}:{quote(s[3], safe='')}@{echo.url[7:]}/y",
                        "headers": {"X-Other": header[2]}}),
                    connector("nats-url", "nats", {
                        "url": f"nats://natsuser:{quote(s[4], safe='')}@{nats_url[7:]}"}),
                    connector("nats-token", "nats", {"url": nats_url, "token": s[5]}),
                    connector("nats-pass", "nats", {"url": nats_url, "user": "natsuser",
                                                    "password": s[6]}),
                    connector("kafka", "kafka", {
                        "bootstrap_servers": f"kuser:{s[7]}@127.0.0.1:{free_port()}",
                        "delivery_timeout": "1s",
                        "sasl": {"mechanism": "PLAIN", "username": "kuser", "password": s[8]},
                        "librdkafka": {"sasl.oauthbearer.client.secret": s[9]}}),
                    connector("sqs", "sqs", {
                        "queue_url": "http://127.0.0.1:1/123456789012/q.fifo",
                        "endpoint_url": f"http://akid:{quote(s[10], safe='')}@127.0.0.1:"
                                        f"{free_port()}",
                        "access_key_id": "akid", "secret_access_key": s[11],
                        "session_token": s[12]}),
                ],
            }  # fmt: skip
            planted = [*s, *token, *header, basic(HOOK_USER, s[3])]
            seen = []
            # NATS turning its credentials away would end weir run for a connector of the
            # file (tests/integration/test_first_run.py): these are made over the API instead,
            # and retry, saying why
            made = [c for c in spec["connectors"] if c["type"] == "nats"]
            spec["connectors"] = [c for c in spec["connectors"] if c not in made]
            with running(tmp, spec, token[0]) as (client, config):
                for c in made:
                    r = client.post("/v1/connectors", json=c)
                    assert r.status_code == 201, r.text
                    seen.append(r.text)
                with psycopg.connect(secrets_db, autocommit=True) as conn:
                    conn.execute("INSERT INTO t (body) VALUES ('x')")
                for name in ("hooks", "hooks-basic"):
                    wait_for(lambda n=name: failed_entries(client, n), timeout=30,
                             what=f"{name}'s failed list")  # fmt: skip
                    entry = failed_entries(client, name)[-1]
                    assert "HTTP 401" in entry["error"], entry
                    seen += [
                        client.get(f"/v1/connectors/{name}/failed").text,
                        client.get(f"/v1/connectors/{name}/failed/{entry['id']}").text,
                    ]
                cli = ("--config", str(config))
                seen += [weir("failed", "list", "hooks", *cli),  # the bearer token's echo
                         weir("failed", "show", "hooks-basic", entry["id"], *cli),  # Basic's
                         weir("status", *cli, "--interval", "0.1")]  # fmt: skip
                for name in [c["name"] for c in spec["connectors"] + made]:
                    seen += [client.get(f"/v1/connectors/{name}{tail}").text
                             for tail in ("", "/config")]  # fmt: skip
                seen += [client.get(p).text for p in ("/v1/sources", "/v1/connectors", "/ready")]
                for broken in broken_connectors(s[13:21]):  # secrets only the body holds
                    r = client.post("/v1/connectors", json=broken)
                    assert r.status_code == 422, r.text
                    seen.append(r.text)
                console = httpx.Client(base_url=client.base_url, timeout=30)
                console.post("/console/login", data={"token": token[0]})
                seen += [console.get(p).text for p in ("/console", "/console/failed/hooks",
                                                       "/console/failed/hooks-basic")]  # fmt: skip
                console.close()
            seen.append((tmp / "run.log").read_text())
        text = "\n".join(seen)
        assert "connector nats-url" in text and "connector sqs" in text, text
        assert not found(planted, text), found(planted, text)

    check()


def test_nothing_that_is_no_secret_is_masked(
    tmp_path: Path, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """The password ``secret`` of docs/configuration.md “Secrets” and the compose file's ``weir``: a
    connector named
    ``secretnats`` with the namespace ``secret``, made over the API, keeps its name and its
    config round-trips; the log's logger names and a receiver's answer holding the letters
    stay as they are, while the passwords themselves are masked. So does a table named as the
    password, of a schema the source follows, in its backfill's lines (they read
    ``backfill public.***``, its progress too; found by an outside tryout)."""
    token = "a-token-of-24-characters"
    with fresh_database(pg_server) as db, Echo(body="a secretive and weird answer") as echo:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id serial PRIMARY KEY, body text)")
            conn.execute("CREATE TABLE secret (id int PRIMARY KEY)")
            conn.execute("INSERT INTO secret VALUES (1), (2)")
        spec = {
            "api": {"listen": f"127.0.0.1:{free_port()}", "tokens": [token]},
            "store": {"url": with_password(db, "postgres", "weir")},
            "sources": [{"name": "app", "kind": "postgres", "schemas": ["public"],
                         "url": with_password(db, "postgres", "secret"), "slot": "words",
                         "backfill": {}}],
            "connectors": [{"name": "weird-hooks", "type": "webhook", "stream": "events",
                            "retry": {"initial": "10ms", "max_attempts": 1},
                            "webhook": {"url": f"{echo.url}/x", "secret": "secret"}}],
        }  # fmt: skip
        made = {"name": "secretnats", "type": "nats", "stream": "events",
                "nats": {"url": nats_server.url, "namespace": "secret"}}  # fmt: skip
        with running(tmp_path, spec, token) as (client, config):
            r = client.post("/v1/connectors", json=made)
            assert r.status_code == 201, r.text
            shown = client.get("/v1/connectors/secretnats/config").json()["config"]
            assert shown["name"] == "secretnats" and shown["nats"]["namespace"] == "secret"
            r = client.put("/v1/connectors/secretnats", json=shown)  # sent back as read
            assert r.status_code == 200, r.text
            again = client.get("/v1/connectors/secretnats/config").json()["config"]
            assert again == shown
            hooks = client.get("/v1/connectors/weird-hooks/config").json()["config"]
            assert hooks["webhook"]["secret"] == "**********"  # a secret field, by field
            names = [c["name"] for c in client.get("/v1/connectors").json()]
            assert sorted(names) == ["secretnats", "weird-hooks"]
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("INSERT INTO t (body) VALUES ('secret weir')")
            wait_for(lambda: failed_entries(client, "weird-hooks"), what="the failed entry")
            entry = failed_entries(client, "weird-hooks")[0]
            assert entry["error"].endswith("HTTP 401: a secretive and weird answer"), entry
            one = client.get(f"/v1/connectors/weird-hooks/failed/{entry['id']}").json()
            assert one["message"]["record"]["body"] == "secret weir"  # data is no config
            status = weir("status", "--config", str(config), "--interval", "0.1")
            assert "secretnats" in status and "weird-hooks" in status, status
        log = (tmp_path / "run.log").read_text()
    lines = [line for line in log.splitlines() if line[:4].isdigit()]  # records' first lines
    heads = [re.match(r"\S+ \S+ [A-Z]+ [\w.]+: ", line) for line in lines]
    assert lines and all(heads), log  # the logger's name is never masked
    assert "secretnats" in log and "weird-hooks" in log and "to schema weir" in log, log
    assert "backfill public.secret: 2 rows read" in log, log
    messages = "\n".join(line[h.end() :] for line, h in zip(lines, heads, strict=True) if h)
    assert MASK not in messages.replace(f":{MASK}@", ""), messages  # only URL passwords,
    assert ":secret@" not in log and ":weir@" not in log, log  # and they are


def test_echoes_decoded_encoded_escaped_or_recased_and_a_nats_token(
    tmp_path: Path, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """A receiver that answers with the credentials it got, as it read them: Basic's decoded
    ``user:password``, a header percent-encoded as ``quote()`` writes it (keeping ``/``), JSON
    with ``\\/``, lower-cased; a NATS URL whose user info is a token; and a config sent back
    with a masked query token kept in a changed URL (found by an outside tester)."""
    token = "a-token-of-24-characters"
    headers = {"basic": f"Basic {basic('apiuser', 'apiPass77')}",
               "quoted": "Bearer a/b+c=d e&f", "slashed": "Bearer Sl/ashTok/en99",
               "cased": "Bearer MiXeDCaseTok99"}  # fmt: skip
    said = (f"bad credentials apiuser:apiPass77 | {quote(headers['quoted'])} | "
            f"{json.dumps(headers['slashed']).replace('/', chr(92) + '/')} | "
            f"{headers['cased'].lower()}")  # fmt: skip
    with fresh_database(pg_server) as db, Echo(body=said) as echo:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id serial PRIMARY KEY, body text)")
        spec = {
            "api": {"listen": f"127.0.0.1:{free_port()}", "tokens": [token]},
            "store": {"url": db},
            "sources": [{"name": "app", "kind": "postgres", "tables": ["public.t"], "url": db,
                         "slot": "echoes"}],
            "connectors": [{"name": f"hook-{k}", "type": "webhook", "stream": "events",
                            "retry": {"initial": "10ms", "max_attempts": 1},
                            "webhook": {"url": f"{echo.url}/x", "headers": {"Authorization": v}}}
                           for k, v in headers.items()],
        }  # fmt: skip
        nats_url = f"nats://UrlTok3nZZ9@127.0.0.1:{nats_server.port}"
        hook = {
            "name": "made",
            "type": "webhook",
            "stream": "events",
            "webhook": {"url": f"{echo.url}/json?token=T0kSecret99&api_key=K3ySecret99"},
        }
        seen = []
        with running(tmp_path, spec, token) as (client, config):
            for made in (hook, {"name": "natstok", "type": "nats", "stream": "events",
                                "nats": {"url": nats_url}}):  # fmt: skip
                r = client.post("/v1/connectors", json=made)
                assert r.status_code == 201, r.text
                seen.append(r.text)
            shown = client.get("/v1/connectors/made/config").json()["config"]
            assert shown["webhook"]["url"].endswith("/json?token=***&api_key=***"), shown
            shown["webhook"]["url"] = shown["webhook"]["url"].replace("/json", "/other")
            r = client.put("/v1/connectors/made", json=shown)
            assert r.status_code == 422 and "webhook" in r.text and "url" in r.text, r.text
            seen += [r.text, client.get("/v1/connectors/natstok/config").text]
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("INSERT INTO t (body) VALUES ('x')")
            for name in (f"hook-{k}" for k in headers):
                wait_for(lambda n=name: failed_entries(client, n), timeout=30, what=name)
                seen += [client.get(f"/v1/connectors/{name}/failed").text,
                         weir("failed", "list", name, "--config", str(config))]  # fmt: skip
        seen.append((tmp_path / "run.log").read_text())
    text = "\n".join(seen)
    assert "bad credentials" in text and "nats://***@127.0.0.1" in text, text
    for secret in ("apiPass77", "a/b", "ashTok", "mixedcasetok99", "UrlTok3nZZ9", "T0kSecret99"):
        assert secret.lower() not in text.lower(), (secret, text)
