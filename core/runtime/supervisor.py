"""``weir run``: a supervisor of worker processes, so that Weir uses every core (docs/operations.md
“Scaling out”).

What runs in which process (``weir run --single-process`` runs all of it in one):

=====================  ======================================================================
the supervisor         waits for the store, starts the workers, restarts one that dies,
                       forwards SIGTERM/SIGINT to them and exits 1 when one failed for good;
                       it holds no lease and no connection
``sources-<i>``         the capture and the backfills of postgres source k of the file, for
                       every k with k mod ``workers.sources`` = i (default 1 process); the
                       retention and slot-lag jobs run in the first worker of the list
``connectors-<i>``     connector shard k of the file (its connectors' shards in order, one
                       per connector without ``shards:``), for every k with k mod
                       ``workers.connectors`` = i (default 1 process), on one asyncio loop
``api``                the HTTP API, when ``api:`` is given
=====================  ======================================================================

Inside a worker, ``serve`` (core/runtime/service.py) runs the works of its role in threads, each
under its lease as with several instances: a worker that dies loses its leases with its lease
connection, and whoever polls first (its restarted self, or another instance) takes the works
over. A worker is ``weir run --worker NAME --parent PID`` (hidden options), so it reads the same
config file and logs to the same stderr. Workers die with the supervisor: the kernel SIGKILLs
them when it goes (``PR_SET_PDEATHSIG``), which is the crash ``weir run`` already survives.

Metrics are counted in the workers and served by ``api``: every worker writes its values to
files in the run's ``MetricsDir`` (prometheus_client's multiprocess mode, core/metrics.py), which
``api`` sums at each scrape. The files of a worker that died are kept, so its counts stay in the
totals and no counter goes backwards when it is restarted; a new ``weir run`` starts them from
zero, a counter reset that Prometheus' ``rate`` and ``increase`` handle.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from prometheus_client.multiprocess import mark_process_dead

from core.api.listen import listen
from core.api.waiting import awaited_store
from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.failures import sources_let_in
from core.metrics import SHARED_DIR

log = logging.getLogger("weir")

POLL = 0.2  # seconds between looks at the workers
RESTART_FIRST, RESTART_MAX = 0.5, 30.0  # seconds before a dead worker is started again
STABLE = 60.0  # seconds a worker must live for its next restart to wait RESTART_FIRST again
DRAIN_MARGIN = 5.0  # seconds past the grace period before a worker that drains is killed
FAILED_FOR_GOOD = (1, 2)  # exit statuses of serve's failure and of a config error: no restart
PR_SET_PDEATHSIG = 1
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Worker:
    """One worker process of the plan: it runs the works of ``role`` whose position k in the
    file has k mod ``of`` = ``index``."""

    role: str  # sources | connectors | api
    index: int
    of: int
    jobs: bool  # it runs the scheduled jobs (runtime/jobs.py)

    @property
    def name(self) -> str:
        return self.role if self.role == "api" else f"{self.role}-{self.index}"

    def runs(self, role: str, position: int) -> bool:
        """Whether this worker runs the work of ``role`` at ``position`` in the file."""
        return role == self.role and position % self.of == self.index


def plan(cfg: WeirConfig) -> list[Worker]:
    """The workers ``cfg`` needs, never more processes of a role than it has works."""
    counts = {
        "sources": min(
            cfg.workers.sources, sum(isinstance(s, PostgresSource) for s in cfg.sources)
        ),
        # With the API, connectors may be made over it: the processes are there for them.
        "connectors": cfg.workers.connectors
        if cfg.api is not None
        else min(cfg.workers.connectors, len(cfg.connector_shards())),
        "api": 0 if cfg.api is None else 1,
    }
    roles = [(role, i, n) for role, n in counts.items() for i in range(n)]
    return [Worker(role, i, n, jobs=j == 0) for j, (role, i, n) in enumerate(roles)]


def worker_named(cfg: WeirConfig, name: str) -> Worker:
    """The worker ``name`` of ``cfg``'s plan; SystemExit(2) when the file no longer has it."""
    for w in plan(cfg):
        if w.name == name:
            return w
    log.error("worker %s: the config file has changed and no longer needs it; restart weir run",
              name)  # fmt: skip
    raise SystemExit(2)


def die_with_parent(parent: int) -> None:
    """Called first in a worker: when the supervisor ``parent`` dies (SIGKILL included), the
    kernel SIGKILLs this worker (Linux); elsewhere a thread looks for it every second.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        set_by_kernel = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        set_by_kernel = False
    if not set_by_kernel:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if os.getppid() != parent:  # it died before the kernel was told
        os.kill(os.getpid(), signal.SIGKILL)


def describe(status: int) -> str:
    """A Popen returncode in words: ``exited with status 3``, ``killed by SIGKILL``."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


class MetricsDir:
    """The run's ``PROMETHEUS_MULTIPROC_DIR``: where its workers keep their metric values for
    the ``api`` process to sum (core/metrics.py), and the lines said once for all of them
    (core/runtime/connectors.py ``first_in_run``); ``weir-metrics-*`` in the temp directory,
    removed when the run ends. A supervisor holds a lock on its directory while it lives, so
    the directory of one that was SIGKILLed is removed by the next that starts on this host.
    """

    PREFIX = "weir-metrics-"

    def __init__(self) -> None:
        tmp = tempfile.gettempdir()
        for name in os.listdir(tmp):
            if name.startswith(self.PREFIX):
                self._remove_if_abandoned(os.path.join(tmp, name))
        staging = tempfile.mkdtemp(prefix="." + self.PREFIX)  # locked before the sweep sees it
        self._lock = os.open(staging, os.O_RDONLY)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.path = os.path.join(tmp, os.path.basename(staging)[1:])
        os.rename(staging, self.path)

    @staticmethod
    def _remove_if_abandoned(path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # removed meanwhile, or not ours to read
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except BlockingIOError:  # its supervisor lives
            pass
        finally:
            os.close(fd)

    def dead(self, pid: int) -> None:
        """Worker ``pid`` ended: its gauges no longer count (its counters still do)."""
        mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)


class _Child:
    """A worker's process, and when it may be started again after dying."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.restarts = 0  # in a row, each less than STABLE seconds after its start
        self.restart_at = 0.0


class Supervisor:
    """Runs ``plan(cfg)``'s workers until ``stop`` is set (SIGTERM/SIGINT) or one fails for
    good; ``run`` returns the exit status of ``weir run``."""

    def __init__(self, config: str, cfg: WeirConfig, stop: threading.Event, grace: float) -> None:
        self.config = config
        self.cfg = cfg
        self.stop = stop
        self.grace = grace
        self.children = [_Child(w) for w in plan(cfg)]
        self.failed = False

    def run(self) -> int:
        """Start the workers once the store answers, keep them running, then drain them all:
        0 after a signal, 1 when a worker failed for good (a source's FATAL error)."""
        from core.store import open_store

        if not awaited_store(self.cfg, self.stop):
            log.info("stopped before the store answered")
            return 0
        open_store(self.cfg)  # made or migrated once, here: what stops it is said once, exit 1
        sources_let_in(self.cfg)
        if self.cfg.api is not None:  # a port in use is said before capture makes a slot
            try:
                listen(*self.cfg.api.host_port).close()
            except OSError as e:
                log.error("api: cannot start: %s", e)
                return 1
        self.metrics = MetricsDir()
        try:
            self._supervise()
        finally:
            self.metrics.remove()
        log.info("stopped")
        return 1 if self.failed else 0

    def _supervise(self) -> None:
        log.info("instance %d supervising %s", os.getpid(),
                 ", ".join(c.worker.name for c in self.children) or "no worker")  # fmt: skip
        for child in self.children:
            self._start(child)
        while not self.stop.is_set() and not self.failed:
            for child in self.children:
                if child.proc is None:
                    if time.monotonic() >= child.restart_at:
                        self._start(child)
                elif (status := child.proc.poll()) is not None:
                    self._exited(child, status)
            self.stop.wait(POLL)
        self._drain()

    def _start(self, child: _Child) -> None:
        verbose = ["-v"] if log.isEnabledFor(logging.DEBUG) else []
        # The worker runs this process's code: from where it was imported (-P: never from a
        # `core/` in the directory weir was started in).
        path = os.pathsep.join(filter(None, (CODE_ROOT, os.environ.get("PYTHONPATH"))))
        child.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "core.cli", *verbose, "run", "--config", self.config,
             "--worker", child.worker.name, "--parent", str(os.getpid())],
            env={**os.environ, SHARED_DIR: self.metrics.path, "PYTHONPATH": path},
        )  # fmt: skip
        child.started = time.monotonic()
        log.info("worker %s started (pid %d)", child.worker.name, child.proc.pid)

    def _exited(self, child: _Child, status: int) -> None:
        """A worker ended while it should run: stop everything when it failed for good,
        else start it again after a backoff with jitter."""
        assert child.proc is not None
        name, pid = child.worker.name, child.proc.pid
        child.proc = None
        self.metrics.dead(pid)
        if status in FAILED_FOR_GOOD:
            # The worker said why, in one line: this one is no second error to read.
            log.info("worker %s (pid %d) %s: failed for good; stopping every worker",
                     name, pid, describe(status))  # fmt: skip
            self.failed = True
            return
        now = time.monotonic()
        child.restarts = 1 if now - child.started >= STABLE else child.restarts + 1
        delay = min(RESTART_MAX, RESTART_FIRST * 2 ** (child.restarts - 1))
        delay *= random.uniform(0.5, 1.0)
        child.restart_at = now + delay
        log.warning("worker %s (pid %d) %s; restarting it in %.1fs", name, pid,
                    describe(status), delay)  # fmt: skip

    def _drain(self) -> None:
        """SIGTERM to every worker, then wait for the grace period (and a margin for the
        process to end); SIGKILL those still running."""
        running = [c for c in self.children if c.proc is not None and c.proc.poll() is None]
        for child in running:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + DRAIN_MARGIN
        for child in running:
            assert child.proc is not None
            try:
                status = child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s (pid %d) did not drain in time: killed",
                            child.worker.name, child.proc.pid)  # fmt: skip
                child.proc.kill()
                status = child.proc.wait()
            log.info("worker %s (pid %d) %s", child.worker.name, child.proc.pid,
                     "drained" if status == 0 else describe(status))  # fmt: skip
