"""The deploy files: the systemd unit passes `systemd-analyze verify`, and the config the
compose file mounts is valid (tests/integration/test_container.py runs the compose file).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.config.load import load_config

DEPLOY = Path(__file__).parents[2] / "deploy"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (DEPLOY / "systemd" / "weir.service").read_text()
    assert "/opt/weir/bin/weir" in unit
    # verify checks that the commands exist: point them at this checkout's CLI.
    local = tmp_path / "weir.service"
    local.write_text(unit.replace("/opt/weir/bin/weir", str(Path(sys.executable).parent / "weir")))
    out = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # unknown keys and bad values are only warned about
    for hardening in ("User=weir", "NoNewPrivileges=yes", "ProtectSystem=strict",
                      "Restart=on-failure", "EnvironmentFile=/etc/weir/weir.env"):  # fmt: skip
        assert hardening in unit


def test_compose_config_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    monkeypatch.setenv("APP_DB_URL", compose["weir"]["environment"]["APP_DB_URL"])
    monkeypatch.setenv("WEIR_API_TOKEN", "an-api-token-of-32-characters-xx")
    cfg = load_config(DEPLOY / "weir.compose.yaml")
    assert {c.type for c in cfg.connectors} == {"nats", "kafka", "sqs"}
    assert "wal_level=logical" in compose["postgres"]["command"]
    assert compose["weir"]["ports"] == ["127.0.0.1:${WEIR_API_PORT:-7376}:7376"]
    published = [p for s in compose.values() for p in s.get("ports", [])]
    assert published and all(p.startswith("127.0.0.1:") for p in published), published
