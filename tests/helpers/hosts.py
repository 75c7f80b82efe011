"""Test hosts on this machine: network namespaces on one private subnet, for tests of several
`weir run` on machines of their own.

``Hosts(["db", "w1", "w2"])`` makes, with ``ip`` (as root):

- ``weir-PID-switch``: a namespace holding the bridge ``br0`` that every host is plugged into;
- ``weir-PID-NAME`` for each host: loopback up and ``eth0`` = ``10.231.N.K/24`` (K = 1, 2, ...
  in the order given), a veth whose other end is on the bridge;
- a veth ``wPID`` from the test's own namespace to the bridge, with ``10.231.N.254``, so that
  the test reaches the hosts (and they it) over the switch, like any other machine on it.

A host's processes see only their own loopback: whatever they reach of another host goes over
the veths and the bridge. Each process in a host also gets a UTS namespace with the host's
name as hostname. ``host.popen(argv)`` runs a process there; ``host.enter`` is the preexec
hook for code that starts its own processes (devkit's servers: ``enter=host.enter``).

Every name holds the test process's pid, so that parallel runs do not clash, and N is a
subnet no address of this namespace is on. On exit every process left in a host is killed
and the namespaces are deleted (their veths go with them); on entry, the namespaces of runs
whose process is gone (killed before it could clean up) are removed the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

from devkit.server import CHECKOUT, child_setup

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET, _CLONE_NEWUTS = 0x40000000, 0x04000000
PREFIX = "weir-"
SUBNET = "10.231"


class HostsError(RuntimeError):
    """The hosts could not be made (not root, no ``ip``): the test fails, it is not skipped."""


def ip(*args: str, check: bool = True) -> str:
    """``ip ARGS``; raises HostsError with ip's own message when it fails and ``check``."""
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise HostsError("test hosts need iproute2's `ip` (apt-get install iproute2)") from None
    if check and done.returncode != 0:
        raise HostsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


class Host:
    """One test host: a network namespace with ``addr`` on the test subnet."""

    def __init__(self, name: str, netns: str, addr: str) -> None:
        self.name = name
        self.netns = netns
        self.addr = addr
        self.procs: list[subprocess.Popen[bytes]] = []

    def enter(self) -> None:
        """Move the calling process into the host: its network and a hostname of its own.
        For a preexec_fn (a child before it execs), never for the test process itself."""
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        try:  # os.setns and os.unshare are Python 3.12's: libc's here
            if _libc.setns(fd, _CLONE_NEWNET) != 0 or _libc.unshare(_CLONE_NEWUTS) != 0:
                raise OSError(ctypes.get_errno(), f"entering host {self.name}")
        finally:
            os.close(fd)
        socket.sethostname(self.name)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """``argv`` in the host, in a session of its own, from the checkout, killed when the
        test process dies (call it from the main thread: the kernel ties the child to the
        thread that started it) and on the Hosts' exit."""
        kwargs.setdefault("cwd", CHECKOUT)
        proc = subprocess.Popen(argv, preexec_fn=child_setup(None, None, self.enter), **kwargs)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Signal ``proc``'s whole process group (it and what it started)."""
        os.killpg(proc.pid, sig)

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.addr})"


class Hosts:
    """The test hosts, by name, as a context manager; ``hosts.addr`` is the test's own address."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.run = f"{PREFIX}{os.getpid()}-"
        self.hosts: dict[str, Host] = {}
        self.made: list[str] = []  # the namespaces made so far, for cleanup
        self.addr = ""

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Hosts:
        if os.geteuid() != 0:
            raise HostsError(
                "test hosts need root: network namespaces and veths need CAP_NET_ADMIN in this "
                "namespace (run the tests as root)"
            )
        remove_leftovers()
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def _make(self) -> None:
        net = f"{SUBNET}.{free_subnet()}"
        switch = self._netns("switch")
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        own = f"w{os.getpid()}"  # the test's own end, in this namespace: name it after the run
        ip("link", "add", own, "type", "veth", "peer", "name", "h-test", "netns", switch)
        ip("-n", switch, "link", "set", "h-test", "master", "br0", "up")
        self.addr = f"{net}.254"
        ip("addr", "add", f"{self.addr}/24", "dev", own)
        ip("link", "set", own, "up")
        for k, name in enumerate(self.names, start=1):
            ns = self._netns(name)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", switch, "link", "add", f"h-{name}", "type", "veth",
               "peer", "name", "eth0", "netns", ns)  # fmt: skip
            ip("-n", switch, "link", "set", f"h-{name}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{net}.{k}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            self.hosts[name] = Host(name, ns, f"{net}.{k}")

    def _netns(self, name: str) -> str:
        ns = self.run + name
        ip("netns", "add", ns)
        self.made.append(ns)
        return ns

    def close(self) -> None:
        """Kill what runs in the hosts, then delete them: veths and bridge go with them."""
        for host in self.hosts.values():
            for proc in host.procs:
                if proc.poll() is None:
                    host.kill(proc)
                proc.wait()
        if self.addr:  # it would go with the switch, but only later: the kernel does it async
            ip("link", "del", f"w{os.getpid()}", check=False)
        for ns in reversed(self.made):
            remove_netns(ns)
        self.made.clear()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def remove_netns(ns: str) -> None:
    """Kill every process in ``ns``, then delete it."""
    for pid in ip("netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", ns, check=False)


def remove_leftovers() -> None:
    """Delete the namespaces of test runs whose process is gone."""
    for line in ip("netns", "list").splitlines():
        m = re.match(rf"({PREFIX}(\d+)-\S+)", line)
        if m and not Path(f"/proc/{m[2]}").exists():
            remove_netns(m[1])


def free_subnet() -> int:
    """A third octet of 10.231.x.0/24 that no address of this namespace is on."""
    taken = {int(x) for x in re.findall(rf"inet {SUBNET}\.(\d+)\.", ip("-4", "-o", "addr"))}
    start = os.getpid() % 250
    for n in (1 + (start + i) % 250 for i in range(250)):
        if n not in taken:
            return n
    raise HostsError(f"every {SUBNET}.x.0/24 is taken by some other run")
