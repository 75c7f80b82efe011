"""Config files: env substitution, and errors naming the file, line and key path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, TypeAdapter, ValidationError

from core.config.base import Duration, duration_text
from core.config.load import ConfigError, load_config
from core.config.model import CONNECTOR
from core.config.settings import settings_or_exit
from core.config.sources import PostgresSource
from core.registry import connector_specs


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "weir.yaml"
    path.write_text(text)
    return path


def test_env_substitution_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_DB_URL", "postgresql://weir:s3cret@db/app")
    cfg = load_config(
        _write(
            tmp_path,
            "sources:\n"
            "  - name: app-db\n"
            "    kind: postgres\n"
            "    url: ${APP_DB_URL}\n"
            "    slot: ${SLOT:-weir_slot_2}\n"
            "    tables: [public.users]\n"
            "    max_batch: ${BATCH:-100}\n"
            "store: {events_retention: 12h}\n",
        )
    )
    src = cfg.sources[0]
    assert isinstance(src, PostgresSource)
    assert src.slot == "weir_slot_2" and src.max_batch == 100
    assert cfg.store_url == "postgresql://weir:s3cret@db/app"
    assert cfg.store.events_retention.total_seconds() == 12 * 3600
    assert "s3cret" not in repr(cfg)  # secrets never print


def test_every_problem_names_file_line_and_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "store: {schema: Bad-Name, bogus: 1}\n"
        "sources:\n"
        "  - name: app\n"
        "    kind: postgres\n"
        "    url: postgresql://x\n"
        "    tables: [users]\n"
        "  - {name: s, kind: http}\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "1: store.schema: must be a lower-case SQL identifier",
        "1: store.bogus: unknown key",
        "6: sources[0].tables[0]: 'users': tables are written schema.table, with "
        '"double quotes" around a name that holds a dot or a quote (public."my.table")',
        "7: sources[1].provider: Field required",
    ]
    assert str(e.value).startswith(f"{path}:1: store.schema")


def test_missing_variable_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"weir.yaml:2: sources\[0\]\.url: environment variable"):
        load_config(_write(tmp_path, "sources:\n  - {name: a, kind: postgres, url: '${NOPE_X}'}\n"))
    with pytest.raises(ConfigError, match=r"weir.yaml:3: invalid YAML: expected .,. or .]."):
        load_config(_write(tmp_path, "sources:\n  - [unclosed\n"))


def test_a_command_that_does_not_serve_the_api_needs_none_of_its_variables(
    tmp_path: Path,
) -> None:
    """`weir status`, `failed`, `backfill` ... where the API's token is not set: they load; the
    other sections' variables are still needed, and `weir run` needs them all."""
    path = _write(tmp_path, "sources: [{name: a, kind: postgres, url: 'postgresql://h/db',"
                  " tables: [public.t]}]\n"
                  "consumers: [{name: c, stream: events}]\n"
                  "api: {listen: '${NO_LISTEN}', tokens: ['${NO_TOKEN_X}']}\n")  # fmt: skip
    assert load_config(path, api=False).consumers[0].name == "c"
    with pytest.raises(ConfigError, match=r"api.tokens\[0\]: environment variable NO_TOKEN_X"):
        load_config(path)
    path.write_text(path.read_text().replace("postgresql://h/db", "${NO_URL_X}"))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.url: environment variable NO_URL_X") as e:
        load_config(path, api=False)
    assert "NO_TOKEN_X" not in str(e.value)


def test_validate_exits_2_with_the_problems(tmp_path: Path) -> None:
    path = _write(tmp_path, "sources:\n  - {name: a, kind: kafka}\n")
    run = subprocess.run(
        [sys.executable, "-m", "core.cli", "config", "validate", str(path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert f"{path}:2: sources[0]: Input tag 'kafka'" in run.stderr


def test_example_configs_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_API_TOKEN", "an-api-token-of-32-characters-xx")  # no default: a secret
    examples = sorted(Path(__file__).parents[2].joinpath("config", "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(path)


def test_json_schema_is_up_to_date() -> None:
    from core.config.schema import PATH, render

    assert PATH.read_text() == render(), (
        "config/weir.schema.json is stale: python -m core.config.schema"
    )


def test_the_json_schema_takes_what_the_models_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """An editor checking a config against config/weir.schema.json flags nothing Weir takes:
    the examples, and a NATS stream given in part (the rest of it keeps its defaults)."""
    import jsonschema
    import yaml

    from core.config.model import WeirConfig
    from core.config.schema import PATH

    monkeypatch.setenv("WEIR_API_TOKEN", "an-api-token-of-32-characters-xx")
    check = jsonschema.Draft202012Validator(yaml.safe_load(PATH.read_text()))
    partial = {"store": {"url": "postgresql://weir@127.0.0.1/app"}, "connectors": [
        {"name": "n", "type": "nats", "stream": "records",
         "nats": {"url": "nats://127.0.0.1:4222", "records_stream": {"max_age": "1d"},
                  "events_stream": {"replicas": 3}}}]}  # fmt: skip
    WeirConfig.model_validate(partial)
    examples = Path(__file__).parents[2].joinpath("config", "examples").glob("*.yaml")
    configs = [partial, *(yaml.safe_load(p.read_text()) for p in examples)]
    for config in configs:
        assert [e.message for e in check.iter_errors(config)] == [], config


def test_every_key_has_a_description() -> None:
    """The JSON Schema and the configuration page show them."""
    from core.config.schema import schema

    doc = schema()
    models = [("WeirConfig", doc), *doc["$defs"].items()]
    bare = [
        f"{name}.{key}"
        for name, model in models
        for key, field in model.get("properties", {}).items()
        if "description" not in field
    ]
    assert not bare, f"give these config fields a Field(description=...): {bare}"


def test_configuration_page_is_up_to_date() -> None:
    from core.config.reference import PAGE, rewrite

    assert PAGE.read_text() == rewrite(PAGE.read_text()), (
        "docs/configuration.md “Keys” is stale: .venv/bin/python -m core.config.schema rewrites it"
    )


def test_connector_problems_name_the_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "sources: [{name: app, kind: postgres, url: 'postgresql://x', tables: [public.t]}]\n"
        "connectors:\n"
        "  - name: c1\n"
        "    type: nats\n"
        "    stream: records\n"
        "    actions: [insert]\n"
        "  - name: c2\n"
        "    type: nats\n"
        "    stream: events\n"
        "    sources: [nope]\n"
        "    filters: [{column: v, op: in, value: 3}]\n"
        "    nats: {url: 'http://x', token: t, user: u, password: p}\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "3: connectors[0]: actions: filters the events stream only",
        "11: connectors[1].filters[0]: op 'in' needs a list value",
        "12: connectors[1].nats.url: 'http://x': expected nats://host:port "
        "(or tls://, ws://, wss://)",
    ]


def test_files_the_config_names_are_read_at_load(tmp_path: Path) -> None:
    """A CA, key, seed or credentials file this process cannot read is named with its key when
    the config is loaded (weir config validate, weir run, the management API): it was taken,
    and every connect then failed as if the server could not be reached, for ever. A CA that
    is no PEM too (Kafka's: test_librdkafka_properties_are_known_at_load)."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    path = _write(
        tmp_path,
        "connectors:\n"
        "  - {name: a, type: nats, stream: events, nats: {creds_file: /nowhere/a.creds}}\n"
        f"  - {{name: b, type: nats, stream: events, nats: {{nkey_seed_file: {tmp_path}}}}}\n"
        "  - name: c\n"
        "    type: kafka\n"
        "    stream: events\n"
        f"    kafka: {{tls: {{ca_file: {ca}, cert_file: {tmp_path}/no.pem, key_file: {ca}}}}}\n"
        f"  - {{name: d, type: nats, stream: events, nats: {{tls: {{ca_file: {ca}}}}}}}\n"
        f"  - {{name: e, type: nats, stream: events, nats: {{creds_file: {tmp_path}/fifo}}}}\n"
        "  - {name: f, type: nats, stream: events, nats: {creds_file: ''}}\n"
        "  - {name: g, type: nats, stream: events, nats: {creds_file: ~no_such_user/a}}\n",
    )
    os.mkfifo(tmp_path / "fifo")  # opened, it waited for a writer: the API and every connector
    with pytest.raises(ConfigError) as e:
        load_config(path)
    problems = [p.split(" (_ssl.c")[0] for p in e.value.problems]  # Python's line
    assert problems == [
        "2: connectors[0].nats.creds_file: cannot read /nowhere/a.creds: no such file or directory",
        f"3: connectors[1].nats.nkey_seed_file: cannot read {tmp_path}: it is a directory",
        f"7: connectors[2].kafka.tls.cert_file: cannot read {tmp_path}/no.pem: no such file or "
        "directory",
        f"8: connectors[3].nats: tls.ca_file {ca}: no CA certificates in PEM ([X509] PEM lib",
        f"9: connectors[4].nats.creds_file: cannot read {tmp_path}/fifo: it is not a regular file",
        "10: connectors[5].nats.creds_file: is empty: give a file's path",
        "11: connectors[6].nats.creds_file: cannot read ~no_such_user/a: no home directory for "
        "its ~",  # Python's RuntimeError: a 500 from the API (found by schemathesis)
    ]


def test_librdkafka_properties_are_known_at_load(tmp_path: Path) -> None:
    """A property librdkafka does not know, or a value it does not take, is said at load, at
    its key: the producer refused it at each connect, which Weir retried for ever (found by an
    outside tryout). Properties that go together are taken together."""
    head = (
        "store: {url: 'postgresql://weir@127.0.0.1/app'}\n"
        "connectors:\n  - {name: k, type: kafka, stream: events, kafka: {librdkafka: "
    )
    oidc = "sasl.mechanism: OAUTHBEARER, sasl.oauthbearer.method: oidc"
    for props, key, problem in [
        ("linger.msec: 5", "linger.msec", 'No such configuration property: "linger.msec"'),
        ("compression.codec: zip", "compression.codec",
         'Invalid value "zip" for configuration property "compression.codec"'),
        (oidc, "sasl.oauthbearer.method", "is mandatory when `sasl.oauthbearer.method=oidc`"),
        ("bootstrap.servers: '127.0.0.1:1'", "bootstrap.servers",
         "give it as kafka.bootstrap_servers"),
        ("acks: 1", "acks", "Weir's producer waits for every in-sync replica (acks=all)"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, head + "{" + props + "}}}\n"))
        [said] = e.value.problems
        assert said.startswith(f"3: connectors[0].kafka.librdkafka.{key}: ") and problem in said
    ok = (
        f"{oidc}, sasl.oauthbearer.client.id: weir, sasl.oauthbearer.client.secret: s3cret,"
        " sasl.oauthbearer.token.endpoint.url: 'https://idp.example/token', linger.ms: 20"
    )
    cfg = load_config(_write(tmp_path, head + "{" + ok + "}}}\n"))
    assert cfg.connectors[0].kafka.librdkafka["linger.ms"] == 20
    # With Weir's own: sasl: and a mechanism no broker has; tls: with a CA that is no PEM.
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    for kafka, said in [
        ("sasl: {username: u, password: pw}, librdkafka: {sasl.mechanism: BOGUS}",
         "3: connectors[0].kafka: Failed to create producer: Unsupported SASL mechanism: BOGUS"),
        (f"tls: {{ca_file: {junk}}}",
         "3: connectors[0].kafka.tls.ca_file: Failed to create producer: ca_file failed: "),
    ]:  # fmt: skip
        text = head.replace("kafka: {librdkafka: ", "kafka: {" + kafka + "}}\n")
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, text))
        assert e.value.problems[0].startswith(said), e.value.problems


def test_librdkafka_errors_name_the_keys_as_written(tmp_path: Path) -> None:
    """librdkafka names a property by its own name, not the alias the config wrote (linger.ms
    is its queue.buffering.max.ms; found by an outside tryout), nor Weir's key that set it:
    each is named as the file writes it, at its line. And an alias is one property: one that
    Weir's keys set is not taken under another name (metadata.broker.list, topic.acks), nor
    one property under two names."""
    head = (
        "connectors:\n"
        "  - name: k\n"
        "    type: kafka\n"
        "    stream: events\n"
        "    kafka:\n"
        "      delivery_timeout: 10s\n"
        "      librdkafka:\n"
    )
    for props, said in [
        (["linger.ms: soon"], ['8: connectors[0].kafka.librdkafka.linger.ms: Invalid value for '
                               'configuration property "linger.ms"']),
        (["retries: -1"], ['8: connectors[0].kafka.librdkafka.retries: Configuration property '
                           '"retries" value -1 is outside allowed range 0..2147483647']),
        (["linger.ms: 20000"], ["6: connectors[0].kafka: Failed to create producer: "
                                "`delivery_timeout` must be greater than `librdkafka.linger.ms`"]),
        (["topic.delivery.timeout.ms: 100", "queue.buffering.max.ms: 200"],
         ["6: connectors[0].kafka: Failed to create producer: "
          "`librdkafka.topic.delivery.timeout.ms` must be greater than "
          "`librdkafka.queue.buffering.max.ms`"]),
        (["metadata.broker.list: 'h:1'", "topic.acks: 0", "linger.ms: 3",
          "queue.buffering.max.ms: 4"],
         ["8: connectors[0].kafka.librdkafka.metadata.broker.list: give it as "
          "kafka.bootstrap_servers",
          "9: connectors[0].kafka.librdkafka.topic.acks: Weir's producer waits for every in-sync "
          "replica (acks=all): nothing is lost",
          "11: connectors[0].kafka.librdkafka.queue.buffering.max.ms: the same property as "
          "linger.ms: give it once"]),
    ]:  # fmt: skip
        text = head + "".join(f"        {p}\n" for p in props)
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, text))
        assert e.value.problems == said


def test_weirs_producer_properties_are_each_named_by_their_key() -> None:
    """Every property Weir's keys give the producer has the key that gives it, for librdkafka's
    errors to name (but the client's id, and what Weir's guarantees set)."""
    from connectors.kafka.config import _KEYS, KafkaSasl, KafkaSettings, KafkaTls, _property

    here = Path(__file__)  # no PEM: made without its checks
    tls = KafkaTls.model_construct(ca_file=here, cert_file=here, key_file=here,
                                   key_password=SecretStr("k"))  # fmt: skip
    sasl = KafkaSasl(username="u", password=SecretStr("p"))
    settings = KafkaSettings.model_construct(sasl=sasl, tls=tls)
    given = {_property(p) for p in settings.producer_properties("c")}
    fixed = {"client.id", "security.protocol", "enable.idempotence", "request.required.acks"}
    assert given - fixed == set(_KEYS)
    for prop, key in _KEYS.items():
        assert settings.key_of(prop) == f"kafka.{key}"


def test_filter_values_are_json_as_written(tmp_path: Path) -> None:
    """A filter value is what the record's JSON holds: YAML 1.1's readings of NO (false), 010
    (8), 1:30 (90) and an unquoted date silently selected nothing; .nan and .inf compared
    with nothing and stopped the connector without a word."""
    head = (
        "sources: [{name: app, kind: postgres, url: 'postgresql://x', tables: [public.t]}]\n"
        "connectors:\n"
        "  - name: c1\n"
        "    type: nats\n"
        "    stream: events\n"
        "    nats: {url: 'nats://x:4222', token: t}\n"
    )
    ok = _write(tmp_path, head + "    filters: [{column: v, op: in, value: [NO, 010, 0x1F, 1:30, "
                "2026-11-22, yes, on, 1.5, 10, true, null]}]\n")  # fmt: skip
    values = load_config(ok).connectors[0].filters[0].value
    assert values == ["NO", "010", "0x1F", "1:30", "2026-11-22", "yes", "on", 1.5, 10, True, None]
    bad = _write(tmp_path, head + "    filters: [{column: v, op: '>', value: .nan},\n"
                 "              {column: d, op: in, value: [1, .inf]}, {column: b, op: '=',"
                 " value: !!binary aGk=}]\n")  # fmt: skip
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert e.value.problems == [
        "7: connectors[0].filters[0]: value nan is no JSON number: compare with a "
        "number, or quote it",
        "8: connectors[0].filters[1]: value inf is no JSON number: compare with a "
        "number, or quote it",
        "8: connectors[0].filters[2]: value b'hi' is no JSON value: write it as "
        "text, a number, true, false or null",
    ]


def test_a_nats_stream_given_in_part_keeps_its_other_defaults(tmp_path: Path) -> None:
    """``events_stream: {max_msgs_per_subject: -1}`` (what docs/design.md advises) was refused
    for want of the stream's name and subjects (found by an outside tryout)."""
    path = _write(tmp_path, (
        "sources: [{name: app, kind: postgres, url: 'postgresql://x', tables: [public.t]}]\n"
        "connectors:\n"
        "  - name: c1\n"
        "    type: nats\n"
        "    stream: events\n"
        "    nats: {url: 'nats://x:4222', events_stream: {max_msgs_per_subject: -1},\n"
        "           records_stream: {name: R}}\n"
    ))  # fmt: skip
    nats = load_config(path).connectors[0].nats  # type: ignore[attr-defined]
    events, records = nats.events_stream, nats.records_stream
    assert (events.name, events.subjects, events.max_msgs_per_subject, events.max_age.days) == (
        "SEQUIN-EVENTS", ["sequin-events.>"], -1, 7)  # fmt: skip
    assert (records.name, records.subjects, records.max_msgs_per_subject) == (
        "R", ["sequin-records.>"], 1)  # fmt: skip


def test_a_missing_kind_or_type_names_the_choices(tmp_path: Path) -> None:
    """The registry's connector types (and the source kinds) are what the error offers."""
    path = _write(
        tmp_path,
        "sources: [{name: app, url: 'postgresql://x', tables: [public.t]}]\n"
        "connectors:\n"
        "  - name: c1\n"
        "    stream: records\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    types = {spec.type for spec in connector_specs()}
    assert {"kafka", "nats", "sqs", "webhook"} <= types
    assert e.value.problems == [
        "1: sources[0]: kind: is required (one of http, postgres)",
        f"3: connectors[0]: type: is required (one of {', '.join(sorted(types))})",
    ]


def test_api_and_consumer_problems_are_named(tmp_path: Path) -> None:
    head = "sources: [{name: app, kind: postgres, url: 'postgresql://x', tables: [public.t]}]\n"
    cases = {
        "consumers: [{name: w}]\n": "1: (top): consumers and http sources are "
        "served by the API: add api:",
        "api: {tokens: [short]}\n": "2: api.tokens: every token needs at least 16 characters",
        "api: {tokens: [0123456789abcdefgh]}\nconsumers: [{name: w, max_deliver: 0}]\n": "3: "
        "consumers[0].max_deliver: must be -1 (no limit) or at least 1",
        "api: {tokens: [0123456789abcdefgh]}\nconsumers: [{name: w, max_deliver: 2147483648}]\n": (
            "3: consumers[0].max_deliver: Input should be less than or equal to 2147483647"
        ),
        "api: {tokens: [0123456789abcdefgh]}\nconsumers: [{name: w, sources: [nope]}]\n": "1: "
        "(top): consumer 'w': no source named nope",
    }
    for body, problem in cases.items():
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, head + body))
        assert e.value.problems == [problem], body


def test_bad_urls_are_named_without_their_password(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "store: {url: 'postgresql://weir:pa%ss@127.0.0.1:5432/app'}\n"
        "connectors:\n"
        "  - {name: n, type: nats, stream: events, nats: {url: 'nats:/u:s3cret@h:4222'}}\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "1: store.url: not a valid PostgreSQL URL: invalid percent-encoded token: "
        '"***" (a % in a password is written %25)',
        "3: connectors[0].nats.url: 'nats:/u:***@h:4222': expected nats://host:port "
        "(or tls://, ws://, wss://)",
    ]


@pytest.mark.parametrize("key", ["hots", "passwd"])
def test_a_conninfo_strings_unknown_key_is_named_its_values_are_not(
    tmp_path: Path, key: str
) -> None:
    """libpq names the key it does not know: a key is no secret (found by an outside tester:
    ``invalid connection option "***"``); a value it quotes is left out."""
    url = f"{key}=127.0.0.1 port=5432 user=weir_cdc password=xx dbname=app"
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, f"store: {{url: '{url}'}}\n"))
    assert e.value.problems == [
        f'1: store.url: not a valid PostgreSQL URL: invalid connection option "{key}"'
    ]
    url = "host=127.0.0.1 password='s3cr3t"
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, f'store: {{url: "{url}"}}\n'))
    assert "s3cr3t" not in str(e.value.problems), e.value.problems


@pytest.mark.parametrize("password", ["pa/ss0rd", "pa?ss0rd", "pa#ss0rd"])
def test_a_password_cut_short_by_a_url_delimiter_is_named(tmp_path: Path, password: str) -> None:
    """libpq ends the user info at an unencoded '/', '?' or '#' and reads the password's start
    as a port: the config says so instead, without printing it."""
    path = _write(tmp_path, f"store: {{url: 'postgresql://weir:{password}@127.0.0.1/app'}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "1: store.url: not a valid PostgreSQL URL: its password seems to hold a "
        "'/', '?' or '#' (in a password they are written %2F, %3F and %23)"
    ]


def test_a_nats_password_cut_short_by_a_url_delimiter_is_named(tmp_path: Path) -> None:
    """Else the client reads the password's start as a port, says so (printing it) and the
    connector retries for ever."""
    path = _write(
        tmp_path,
        "store: {url: 'postgresql://127.0.0.1/app'}\nconnectors:\n  - {name: n, type: nats, "
        "stream: events, nats: {url: 'nats://bob:S3cr3t/pa?ss@127.0.0.1:4222'}}\n",
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "3: connectors[0].nats.url: 'nats://bob:***@127.0.0.1:4222': its port is "
        "not a number (in a password, '/', '?', '#' and '@' are written %2F, %3F, %23 and %40)"
    ]


@pytest.mark.parametrize(
    "url",
    ["postgresql://weir:pw@[::1]:5432/app", "postgresql://h1:5432,h2:5433/app?user=weir",
     "postgresql://127.0.0.1/d?password=p/q", "postgresql:///app?host=/tmp"],
)  # fmt: skip
def test_urls_with_ports_hosts_and_paths_are_accepted(tmp_path: Path, url: str) -> None:
    assert load_config(_write(tmp_path, f"store: {{url: '{url}'}}\n")).store.url is not None


def test_a_bad_start_position_is_one_problem(tmp_path: Path) -> None:
    head = "store: {url: 'postgresql://x'}\nconnectors:\n"
    cases = {
        "{seqq: 3}": "start_position: expected beginning, end, {seq: N} or {time: ISO-8601}",
        "begining": "start_position: expected beginning, end, {seq: N} or {time: ISO-8601}",
        "{seq: 1, time: 2}": "start_position: expected beginning, end, {seq: N} or {time: "
        "ISO-8601}",
        "{seq: 0}": "start_position.seq: Input should be greater than or equal to 1",
        # pydantic alone read digits as seconds since 1970: 100 (a seq meant) began in 1970
        "{time: 100}": "start_position.time: an ISO 8601 time, such as 2026-01-31T12:00:00Z",
        "{time: '1700000000'}": "start_position.time: an ISO 8601 time, such as "
        "2026-01-31T12:00:00Z",
    }
    for value, problem in cases.items():
        body = f"  - {{name: c, type: nats, stream: events, start_position: {value}}}\n"
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, head + body))
        assert e.value.problems == [f"3: connectors[0].{problem}"], value
    for value in ("end", "{seq: 7}", "{time: '2026-11-22T10:00:00Z'}", "{time: 2026-11-22}"):
        body = f"  - {{name: c, type: nats, stream: events, start_position: {value}}}\n"
        load_config(_write(tmp_path, head + body))


@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_url_wrapped_in_quotes_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quote: str
) -> None:
    """A weir.env written for systemd (KEY='value') and given to podman's --env-file, which
    keeps the quotes: the error says so, not libpq's words about a piece of the value."""
    monkeypatch.setenv("WEIR_STORE_URL", f"{quote}postgresql://weir:s3cret@127.0.0.1/app{quote}")
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, "store: {url: '${WEIR_STORE_URL}'}\n"))
    assert e.value.problems == [
        "1: store.url: not a valid PostgreSQL URL: the value is wrapped in quotes: remove "
        "them (podman/docker --env-file takes values literally)"
    ]


def test_a_port_out_of_range_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "store: {url: 'postgresql://weir@127.0.0.1:99999999/app'}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.problems == [
        "1: store.url: not a valid PostgreSQL URL: a port is not in 1-65535"
    ]


def test_weir_settings_read_any_case_and_name_a_wrong_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WEIR_LOG_LEVEL", "INFO")  # a crash with a traceback before
    assert settings_or_exit().log_level == "info"
    monkeypatch.setenv("WEIR_LOG_LEVEL", "loud")
    monkeypatch.setenv("WEIR_SHUTDOWN_GRACE", "-1")
    with pytest.raises(SystemExit) as e:
        settings_or_exit()
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "weir: WEIR_LOG_LEVEL=loud: Input should be 'debug', 'info', 'warning' or 'error'",
        "weir: WEIR_SHUTDOWN_GRACE=-1: Input should be greater than 0",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(604800, "7d"), (7200, "2h"), (120, "2m"), (30, "30s"), (1.5, "1500ms"), (0.1, "100ms"),
     (0.0005, "0.5ms"), (0, "0s")],
)  # fmt: skip
def test_a_duration_is_shown_in_the_largest_unit_it_is_whole_in(seconds: float, text: str) -> None:
    """As the configuration page's defaults and the API show it; it reads back the same."""
    assert duration_text(timedelta(seconds=seconds)) == text
    assert TypeAdapter(Duration).validate_python(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(("kind", "settings", "says"), [
    ("webhook", {"url": "http://[::1"}, "not a URL (Invalid IPv6 URL)"),
    ("webhook", {"url": "http://host:port/x"}, "not a URL (Port could not be cast"),
    ("webhook", {"url": "https://"}, "the URL has no host"),
    ("nats", {"url": []}, "give a server's URL"),
    ("nats", {"url": "nats://"}, "the URL has no host"),
    ("sqs", {"queue_url": "http://[q/1/q"}, "not a URL"),
])  # fmt: skip
def test_a_url_that_cannot_be_parsed_is_refused_at_load(
    kind: str, settings: dict[str, Any], says: str
) -> None:
    """Taken before, they were retried for ever as if the receiver were away (found by an
    outside tryout)."""
    with pytest.raises(ValidationError, match=re.escape(says)):
        CONNECTOR.validate_python({"name": "c", "type": kind, "stream": "events",
                                   kind: settings})  # fmt: skip


def test_config_validate_takes_the_file_as_every_command_does(tmp_path: Path) -> None:
    """``weir config validate`` took only a positional file, ignoring ``--config`` and
    ``$WEIR_CONFIG``, which every other command takes (found by an outside walk-through)."""
    path = tmp_path / "weir.yaml"
    path.write_text(
        "sources: [{name: app, kind: postgres, url: 'postgresql://u@127.0.0.1/d',"
        " schemas: [public]}]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "WEIR_CONFIG"}
    for argv, extra in (([str(path)], {}), (["--config", str(path)], {}),
                        ([], {"WEIR_CONFIG": str(path)})):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "core.cli", "config", "validate", *argv],
                              capture_output=True, text=True, env={**env, **extra},
                              timeout=60)  # fmt: skip
        assert (done.returncode, done.stdout) == (0, f"{path}: ok (1 sources, 0 connectors, "
                                                     "0 consumers)\n"), done.stderr  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "core.cli", "config", "validate"],
                          capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "give --config FILE (or set WEIR_CONFIG)" in done.stderr
