"""The Kafka connector over SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and TLS with a CA and a
client certificate: `weir kafka setup` and `weir run` through a front that demands them, in front
of the real broker (front.py beside this file says why a front).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.kafka.config import KafkaSettings
from connectors.kafka.sink import client_config
from core.runtime.service import prepare
from devkit.embedded import EmbeddedKafka
from tests.connectors.kafka.front import KafkaFront, Pki, make_pki
from tests.connectors.kafka.harness import read_kafka
from tests.helpers.capture import wait_for
from tests.helpers.weir import Running, cursor_of, insert_t, serving, weir_config

USERS = {"weir": "correct horse battery staple"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def secured(front: KafkaFront) -> Iterator[KafkaFront]:
    """A broker of its own behind ``front``, advertising the front's address."""
    with front, EmbeddedKafka(advertised=front.bootstrap) as kafka:
        front.backend_port = kafka.port
        yield front


def connector(
    front: KafkaFront, sasl: dict[str, str] | None, tls: dict[str, str] | None
) -> dict[str, Any]:
    kafka: dict[str, Any] = {"bootstrap_servers": front.bootstrap, "topic": "secure-events",
                             "linger": "1ms", "partitions": 2}  # fmt: skip
    if sasl is not None:
        kafka["sasl"] = sasl
    if tls is not None:
        kafka["tls"] = tls
    return {"name": "secure", "type": "kafka", "stream": "events", "kafka": kafka}


def setup_topics(tmp_path: Path, c: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "weir.yaml"
    config.write_text(yaml.safe_dump({"store": {"url": "postgresql://unused@127.0.0.1/x"},
                                      "connectors": [c]}))  # fmt: skip
    command = [sys.executable, "-m", "core.cli", "kafka", "setup", "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def read_all(c: dict[str, Any]) -> list[dict[str, Any]]:
    """Every message of the connector's topic, read with the connector's own credentials."""
    conf = client_config(KafkaSettings.model_validate(c["kafka"]), "check")
    return [d.payload for d in read_kafka(conf, [c["kafka"]["topic"]], 2)]


CASES = {
    "scram-sha-512 over mutual tls": ("SCRAM-SHA-512", "mutual"),
    "scram-sha-256 in the clear": ("SCRAM-SHA-256", None),
    "plain over tls": ("PLAIN", "server"),
    "mutual tls alone": (None, "mutual"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_kafka_connector_delivers_through_sasl_and_tls(
    case: str, pki: Pki, table: str, tmp_path: Path
) -> None:
    mechanism, tls_mode = CASES[case]
    users = USERS if mechanism else None
    front = KafkaFront(
        pki=pki if tls_mode else None, client_certs=tls_mode == "mutual", users=users
    )
    sasl = (
        {"mechanism": mechanism, "username": "weir", "password": USERS["weir"]}
        if mechanism
        else None
    )
    tls = None
    if tls_mode:
        tls = {"ca_file": str(pki.ca)}
        if tls_mode == "mutual":
            tls |= {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    with secured(front):
        c = connector(front, sasl, tls)
        setup = setup_topics(tmp_path, c)
        assert setup.returncode == 0, setup.stderr
        assert "secure-events" in setup.stdout
        with serving(weir_config(table, [c])):
            insert_t(table, range(1, 6))
            wait_for(lambda: cursor_of(table, "secure")[0] == 5, timeout=60, what="5 delivered")
        got = read_all(c)
    assert sorted(m["record"]["id"] for m in got) == [1, 2, 3, 4, 5]
    assert front.refused == []


WRONG = "not-the-password-7fq2"
REFUSALS = {  # what is wrong: (sasl password, tls files, what the connector's state says)
    "wrong password": (WRONG, "mutual", "SASL authentication error: Authentication failed"),
    "no client certificate": (USERS["weir"], "ca only", "SSL connection closed by peer"),
    "untrusted broker certificate": (USERS["weir"], "no ca", "certificate verify failed"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_connection_says_why_and_loses_nothing(
    case: str, pki: Pki, table: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password, files, reason = REFUSALS[case]
    good_tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert),
                "key_file": str(pki.client_key)}  # fmt: skip
    tls = {"mutual": good_tls, "ca only": {"ca_file": str(pki.ca)}, "no ca": {}}[files]
    sasl = {"mechanism": "SCRAM-SHA-512", "username": "weir"}
    front = KafkaFront(pki=pki, client_certs=True, users=USERS)
    caplog.set_level(logging.DEBUG)
    with secured(front):
        fixed = connector(front, sasl | {"password": USERS["weir"]}, good_tls)
        assert setup_topics(tmp_path, fixed).returncode == 0
        c = connector(front, sasl | {"password": password}, tls)
        said = "cannot reach the brokers: .*" + re.escape(reason)
        if password == WRONG:  # credentials turned away: for good, weir run ends saying so
            said = (rf"connector secure: cannot reach Kafka at {re.escape(front.bootstrap)}: "
                    rf".*{re.escape(reason)}.*; check kafka\.sasl's username")  # fmt: skip
            prepare(weir_config(table, [c]))
            insert_t(table, range(1, 6))
            started = time.monotonic()
            assert Running(weir_config(table, [c])).exit_status(60) == 1
            # at once: it waited out the brokers' 10 s of metadata after librdkafka's line
            assert time.monotonic() - started < 9.5
        else:  # what may be a broker's passing trouble: retried, saying why
            with serving(weir_config(table, [c])):
                insert_t(table, range(1, 6))
                wait_for(lambda: any(re.search(said, r.getMessage()) for r in caplog.records
                                     if r.name == "weir.engine"),
                         timeout=60, what=f"the connector to report {reason!r}")  # fmt: skip
        assert any(re.search(said, r.getMessage()) for r in caplog.records), said
        assert cursor_of(table, "secure")[0] <= 0  # nothing went out, nothing was skipped
        client_lines = [r for r in caplog.records if r.name == "weir.kafka.client"]
        assert len(client_lines) <= 4, "librdkafka's repeats are logged once a minute"
        assert not any(
            WRONG in r.getMessage() or USERS["weir"] in r.getMessage() for r in caplog.records
        )
        with serving(weir_config(table, [fixed])):
            wait_for(lambda: cursor_of(table, "secure")[0] == 5, timeout=60, what="5 delivered")
        assert sorted(m["record"]["id"] for m in read_all(fixed)) == [1, 2, 3, 4, 5]
