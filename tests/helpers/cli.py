"""The ``weir`` command in a process of its own, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import httpx

WEIR = [sys.executable, "-m", "core.cli"]


def weir(
    *args: str, code: int | None = 0, env: dict[str, str] | None = None, timeout: float = 60
) -> str:
    """stdout and stderr of ``weir ARGS`` (in ``env``, else this process's environment), which
    must end within ``timeout`` seconds with exit status ``code`` (any when None)."""
    out = subprocess.run([*WEIR, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert code is None or out.returncode == code, out.stdout + out.stderr
    return out.stdout + out.stderr


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 (``/health`` of an API that is up)."""
    try:
        return httpx.get(url).status_code == 200
    except httpx.TransportError:
        return False
