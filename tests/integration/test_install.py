"""The production install: the wheel of the distribution, installed away from the checkout,
holds everything `weir run` needs (the console's templates and static files too) and nothing
of the checkout's development tree (tests, devkit, benches)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import yaml

from devkit.server import free_port
from tests.helpers.capture import wait_for
from tests.helpers.cli import answers

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_wheel_installed_away_from_the_checkout_runs(tmp_path: Path, db_url: str) -> None:
    source = tmp_path / "source"  # a copy: building leaves build/ and egg-info beside it
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(
        ".*", "__pycache__", "*.egg-info", "build"))  # fmt: skip
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("weir-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"core", "connectors", "spark"} <= tops
    assert not tops & {"tests", "devkit", "bench", "deploy"}, tops
    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(wheel)], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    away = tmp_path / "elsewhere"  # not the checkout: nothing of it on the path
    away.mkdir()
    env = os.environ | {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import core; print(core.__file__)"], cwd=away,
                           env=env, capture_output=True, text=True)  # fmt: skip
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    port = free_port()
    config = away / "weir.yaml"
    config.write_text(yaml.safe_dump({
        "store": {"url": db_url},
        "sources": [{"name": "app", "kind": "http", "provider": "shop"}],
        "api": {"listen": f"127.0.0.1:{port}", "tokens": ["a-token-of-24-characters"]},
    }))  # fmt: skip
    weir = [str(site / "bin" / "weir")] if (site / "bin" / "weir").exists() else [
        sys.executable, "-m", "core.cli"]  # fmt: skip
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*weir, "run", "--config", str(config)], cwd=away, env=env,
                               stderr=f)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(f"{base}/health") or run.poll() is not None, timeout=60,
                 what="the installed weir's API")  # fmt: skip
        assert run.poll() is None, log.read_text()
        login = httpx.get(f"{base}/console/login")
        css = httpx.get(f"{base}/console/static/console.css")
        pushed = httpx.post(
            f"{base}/v1/sources/app/records",
            json={"records": [{"collection_id": "c", "record_id": "1", "data": {"a": 1}}]},
            headers={"Authorization": "Bearer a-token-of-24-characters"},
        )
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert login.status_code == 200 and "<form" in login.text, login.text
    assert css.status_code == 200 and css.text.strip(), css.status_code
    assert pushed.status_code == 200, pushed.text
    assert run.returncode == 0, log.read_text()
