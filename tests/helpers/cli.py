"""The ``weir`` command in a process of its own, as a user runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.capture import wait_for

WEIR = [sys.executable, "-m", "core.cli"]


def weir(
    *args: str, code: int | None = 0, env: dict[str, str] | None = None, timeout: float = 60
) -> str:
    """stdout and stderr of ``weir ARGS`` (in ``env``, else this process's environment), which
    must end within ``timeout`` seconds with exit status ``code`` (any when None)."""
    out = subprocess.run([*WEIR, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert code is None or out.returncode == code, out.stdout + out.stderr
    return out.stdout + out.stderr


def run_again(config: Path, env: dict[str, str] | None = None, within: float = 20) -> str:
    """What ``weir run --config CONFIG`` (in ``env``) says: all of it when it stops within
    ``within`` seconds, else what it said until SIGTERM ended it (it went on)."""
    run = subprocess.Popen([*WEIR, "run", "--config", str(config)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        return run.communicate(timeout=within)[0]  # it stopped: say why
    except subprocess.TimeoutExpired:  # it runs
        run.send_signal(signal.SIGTERM)
        return run.communicate(timeout=60)[0]


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 (``/health`` of an API that is up)."""
    try:
        return httpx.get(url).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def running(tmp: Path, spec: dict[str, Any], token: str) -> Iterator[tuple[httpx.Client, Path]]:
    """``weir -v run`` in a process of its own (what it remembers stays there), its log in a
    file; yields an API client and the config's path; on exit it must drain and exit 0."""
    config = tmp / "weir.yaml"
    config.write_text(json.dumps(spec))
    log = tmp / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "-v", "run", "--config", str(config)], stdout=f,
                               stderr=subprocess.STDOUT)  # fmt: skip
    try:
        with httpx.Client(base_url="http://" + spec["api"]["listen"], timeout=30,
                          headers={"Authorization": f"Bearer {token}"}) as client:  # fmt: skip

            def up() -> bool:
                assert run.poll() is None, log.read_text()
                try:
                    return client.get("/v1/sources").status_code == 200
                except httpx.TransportError:
                    return False

            try:
                wait_for(up, timeout=60, what="weir run's API")
            except AssertionError as e:  # say why (a port another test took, say)
                raise AssertionError(f"{e}; its log: {log.read_text()[-3000:]}") from None
            yield client, config
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert run.returncode == 0, log.read_text()
