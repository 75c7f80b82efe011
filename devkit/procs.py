"""A process and its descendants read from Linux's /proc, for the tests and the benches: which
processes `weir run` has (its supervisor and workers), their memory and their CPU time. A
process that ends while it is read is left out (or counts 0)."""

from __future__ import annotations

import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (none once it is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return [int(c) for t in tasks
                for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]  # fmt: skip
    except (FileNotFoundError, ProcessLookupError):
        return []


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    return [pid, *(p for c in children(pid) for p in tree(c))]


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _kb_field(path: str, field: str) -> float:
    """The ``field:`` line of a /proc file that counts kB, in MB (0 once the process is gone)."""
    try:
        text = Path(path).read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return next((int(ln.split()[1]) / 1024 for ln in text.splitlines()
                 if ln.startswith(field + ":")), 0.0)  # fmt: skip


def rss_mb(pid: int) -> float:
    """The resident set of ``pid`` (VmRSS), in MB."""
    return _kb_field(f"/proc/{pid}/status", "VmRSS")


def pss_mb(pid: int) -> float:
    """The proportional set of ``pid`` (Pss: its private pages, and its share of pages it
    shares with other processes, such as the interpreter's libraries), in MB."""
    return _kb_field(f"/proc/{pid}/smaps_rollup", "Pss")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time ``pid`` has used, in seconds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / TICK


def name(pid: int) -> str:
    """What ``pid`` is: its ``--worker`` name for a worker of `weir run`, else its command."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return "?"
    if b"--worker" in argv:
        return argv[argv.index(b"--worker") + 1].decode()
    return Path(argv[0].decode()).name if b"core.cli" not in argv else "supervisor"
