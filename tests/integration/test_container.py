"""Weir's container image and deploy/compose.yaml, as a user runs them (docs/operations.md
“Container”): the image built by deploy/container/build; the compose file, as written, run by
podman-compose, with stand-ins under the names of its other images (tests/helpers/podman.py),
forwarding the changes made in its Postgres to a NATS subscriber on the host, to Kafka and to
SQS; and the image started by testcontainers, as a user's own tests would.

A fresh machine builds the images first (about 4 minutes); later runs reuse them.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import orjson
import pytest
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from core.ids import sync_id_for
from devkit.server import free_port
from tests.helpers.capture import wait_for
from tests.helpers.cli import answers
from tests.helpers.podman import (
    COMPOSE,
    Podman,
    api_service,
    dnat_chains,
    drop_dnat_chains,
    standins,
    stop_conmons,
    weir_image,
)

pytestmark = pytest.mark.timeout(600)  # a first run builds the images

CHANGES = [
    "CREATE TABLE users (id int PRIMARY KEY, name text NOT NULL)",
    "INSERT INTO users VALUES (1, 'Paul')",
    "INSERT INTO users VALUES (2, 'Jessica')",
    "UPDATE users SET name = 'Muad''Dib' WHERE id = 1",
    "DELETE FROM users WHERE id = 2",
]
# What a subscriber of sequin-events.> receives, in this order: subject, then the record (a
# delete's holds the key alone: the table's replica identity is its key).
USERS = f"sequin-events.default.{sync_id_for('app')}.postgres.public:users"
EVENTS = [
    (f"{USERS}.1.inserted", {"id": 1, "name": "Paul"}),
    (f"{USERS}.2.inserted", {"id": 2, "name": "Jessica"}),
    (f"{USERS}.1.updated", {"id": 1, "name": "Muad'Dib"}),
    (f"{USERS}.2.deleted", {"id": 2}),
]


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return Podman(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="module")
def image(podman: Podman) -> str:
    return weir_image(podman)


class Compose:
    """deploy/compose.yaml under a project of its own, its ports free ones of 127.0.0.1."""

    def __init__(self, pm: Podman, image: str) -> None:
        self.pm = pm
        self.project = f"weir-test-{secrets.token_hex(4)}"
        self.token = secrets.token_hex(16)
        self.api = f"http://127.0.0.1:{free_port()}"
        self.nats = f"nats://127.0.0.1:{free_port()}"
        self.chains = dnat_chains()
        self.env = pm.env | {"WEIR_IMAGE": image, "WEIR_API_TOKEN": self.token,
                             "WEIR_API_PORT": self.api.rsplit(":", 1)[1],
                             "NATS_PORT": self.nats.rsplit(":", 1)[1]}  # fmt: skip

    def __call__(self, *args: str, check: bool = True) -> None:
        podman_compose = Path(sys.executable).parent / "podman-compose"
        out = subprocess.run([str(podman_compose), "-p", self.project, "-f", str(COMPOSE), *args],
                             env=self.env, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert not check or out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def logs(self, service: str) -> str:
        return self.pm("logs", self.container(service), check=False)[-3000:]

    def down(self) -> None:
        """Containers, network and what podman leaves running of them, gone."""
        label = f"label=io.podman.compose.project={self.project}"
        ids = self.pm("ps", "-a", "-q", "--no-trunc", "--filter", label).split()
        self("down", "-t", "2", check=False)  # the stand-ins do not stop on SIGTERM
        if left := self.pm("ps", "-a", "-q", "--filter", label).split():
            self.pm("rm", "-f", *left, check=False)
        self.pm("network", "rm", "-f", f"{self.project}_default", check=False)
        stop_conmons(ids)
        drop_dnat_chains(self.chains)


@pytest.fixture
def compose(podman: Podman, image: str) -> Iterator[Compose]:
    standins(podman)
    stack = Compose(podman, image)
    try:
        yield stack
    finally:
        stack.down()


async def _subscribe_then_write(compose: Compose) -> list[tuple[str, dict[str, object]]]:
    """Subscribed to sequin-events.> as ``nats sub`` is, make CHANGES in the compose file's
    Postgres: the messages received, as many as EVENTS."""
    nc = await nats.connect(compose.nats)
    try:
        sub = await nc.subscribe("sequin-events.>")
        await nc.flush()  # the server has the subscription: what comes next is received
        psql = ["psql", "-U", "postgres", "-d", "app", "-v", "ON_ERROR_STOP=1"]
        await asyncio.to_thread(compose.pm, "exec", compose.container("postgres"), *psql,
                                *(a for sql in CHANGES for a in ("-c", sql)))  # fmt: skip
        got = []
        for _ in EVENTS:
            msg = await sub.next_msg(timeout=120)
            got.append((msg.subject, orjson.loads(msg.data)))
        return got
    finally:
        await nc.close()


def test_compose_file_forwards_a_tables_changes(compose: Compose) -> None:
    compose("up", "-d")
    wait_for(lambda: answers(f"{compose.api}/ready"), timeout=180,
             what=f"weir's /ready in the compose file:\n{compose.logs('weir')}")  # fmt: skip
    assert compose.pm("exec", compose.container("weir"), "id", "-un").strip() == "weir"
    got = asyncio.run(_subscribe_then_write(compose))
    assert [(subject, m["record"]) for subject, m in got] == EVENTS, compose.logs("weir")
    assert [m["action"] for _, m in got] == ["insert", "insert", "update", "delete"]

    bearer = {"Authorization": f"Bearer {compose.token}"}
    assert httpx.get(f"{compose.api}/metrics").status_code == 401
    delivered: dict[str, float] = {}

    def all_delivered() -> bool:
        text = httpx.get(f"{compose.api}/metrics", headers=bearer).text
        for line in text.splitlines():
            if line.startswith("weir_connector_delivered_total{"):
                name = line.split('connector="', 1)[1].split('"', 1)[0]
                delivered[name] = float(line.rsplit(" ", 1)[1])
        return all(delivered.get(c, 0) >= len(EVENTS) for c in
                   ("events-to-nats", "events-to-kafka", "events-to-sqs"))  # fmt: skip

    wait_for(all_delivered, timeout=60, what=f"Kafka and SQS deliveries: {delivered}")
    assert delivered["records-to-nats"] >= 2  # the latest versions of users 1 and 2

    weir = compose.container("weir")
    compose.pm("stop", "-t", "45", weir, timeout=90)  # SIGTERM: drains and exits 0
    assert compose.pm("inspect", "--format", "{{.State.ExitCode}}", weir).strip() == "0", (
        compose.logs("weir")
    )


@pytest.fixture
def docker_api(podman: Podman, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """testcontainers on podman's Docker-compatible API, without its reaper (whose image cannot
    be pulled: each test removes its containers)."""
    with api_service(podman) as url:
        monkeypatch.setenv("DOCKER_HOST", url)
        monkeypatch.setattr(testcontainers_config, "ryuk_disabled", True)
        yield


def _validate(image: str, config: Path) -> tuple[int, str]:
    """Exit status and output of ``weir config validate`` in the image, ``config`` mounted."""
    env = {"APP_DB_URL": "postgresql://postgres:weir@postgres/app",
           "WEIR_API_TOKEN": secrets.token_hex(16)}  # fmt: skip
    command = ["config", "validate", "/etc/weir/weir.yaml"]
    container = DockerContainer(image, command=command, env=env)
    with container.with_volume_mapping(str(config), "/etc/weir/weir.yaml"):
        status = container.get_wrapped_container().wait(timeout=60)["StatusCode"]
        out, err = container.get_logs()
        cid = container.get_container_id()
    stop_conmons([cid])
    return status, (out + err).decode()


def test_image_validates_a_config(image: str, docker_api: None, tmp_path: Path) -> None:
    status, out = _validate(image, COMPOSE.parent / "weir.compose.yaml")
    assert (status, out) == (0, "/etc/weir/weir.yaml: ok (1 sources, 4 connectors, 1 consumers)\n")
    bad = tmp_path / "weir.yaml"
    bad.write_text("sources:\n  - name: app\n    kind: postgres\n    tables: [public.users]\n")
    status, out = _validate(image, bad)
    assert status == 2, out
    assert "/etc/weir/weir.yaml:2: sources[0].url: Field required" in out, out
