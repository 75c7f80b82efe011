"""A server in a child process of its own, for the embedded servers (devkit/embedded.py): a
free loopback port, a child that joins a network namespace if asked, drops root if asked and
dies with its parent (``PR_SET_PDEATHSIG``), and a start that fails loudly with the tail of the
server's log. ``Server`` runs a binary on a port until it accepts connections.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

CHECKOUT = Path(__file__).resolve().parents[1]  # devkit/ is not installed: run from here

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """A server could not be started; the message holds the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Enter = Callable[[], None]  # run in a server's child before it drops root (join a netns, say)


def child_setup(uid: int | None, gid: int | None, enter: Enter | None = None) -> Enter:
    """preexec_fn: ``enter`` if given, drop root if asked, then ask the kernel to kill the
    child with its parent.

    The death signal is set after the uid change because changing credentials clears it.
    """

    def setup() -> None:
        os.setsid()
        if enter is not None:
            enter()
        if gid is not None:
            os.setgroups([])
            os.setgid(gid)
        if uid is not None:
            os.setuid(uid)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Server:
    """A server binary in a process of its own, on a loopback port, logging to a temp dir.

    ``stop()`` then ``start()`` restarts it on the same port (and with the same data dir).
    ``host`` and ``enter``: as EmbeddedPostgres's (devkit/embedded.py).
    """

    name = "server"

    def __init__(
        self, port: int | None = None, *, host: str = "127.0.0.1", enter: Enter | None = None
    ) -> None:
        self.port = port or free_port()
        self.host = host
        self.enter = enter
        self.dir = Path(tempfile.mkdtemp(prefix=f"weir-{self.name}-"))
        self.logfile = self.dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        raise NotImplementedError

    def ready(self, sock: socket.socket) -> bool:
        """Whether the server behind a fresh connection to its port is ready."""
        return True

    def start(self) -> Self:
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(  # in the checkout: `-m devkit...` finds devkit there
                self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=CHECKOUT,
                preexec_fn=child_setup(None, None, self.enter),
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"{self.name} exited {self.proc.returncode}:\n{log_tail(self.logfile)}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=1) as sock,
            ):
                if self.ready(sock):
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"{self.name} did not start:\n{log_tail(self.logfile)}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
