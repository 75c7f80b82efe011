"""`weir status` on the screen (core/status_view.py): plain tables through a pipe, for grep and
awk; `--watch` a new reading every interval, redrawn in place on a terminal, until ^C (exit 0).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from core.runtime.service import prepare
from tests.helpers.weir import weir_config

WEIR = [sys.executable, "-m", "core.cli", "status"]
HOOKS = {"name": "hooks", "type": "webhook", "stream": "events",
         "webhook": {"url": "http://127.0.0.1:9/hook"}}  # fmt: skip


def _config(tmp_path: Path, table: str) -> str:
    """A prepared store (the source's slot made, nothing running) and its config file."""
    prepare(weir_config(table, [HOOKS]))
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({"sources": [source], "connectors": [HOOKS]}))
    return str(config)


def _plain_rows(text: str) -> list[list[str]]:
    """The lines of plain output as awk splits them; and they are plain."""
    assert "\x1b" not in text  # no colour, no cursor moves
    assert not re.search("[\u2500-\u257f]", text)  # no box-drawing
    assert all(line == line.rstrip() for line in text.splitlines())
    return [line.split() for line in text.splitlines()]


def _read_until(fd: int, mark: bytes, count: int, timeout: float = 30) -> bytes:
    """What ``fd`` gives until ``mark`` came ``count`` times (the process started slowly on a
    busy machine, maybe), in ``timeout`` seconds at most."""
    out = b""
    deadline = time.monotonic() + timeout
    while out.count(mark) < count and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            out += os.read(fd, 65536)
    return out


def test_through_a_pipe_plain_tables_a_line_a_row(tmp_path: Path, table: str) -> None:
    out = subprocess.run([*WEIR, "--config", _config(tmp_path, table), "--interval", "0.1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = _plain_rows(out.stdout)
    assert rows[0] == ["SOURCE", "KIND", "STATE", "EVENTS", "SEQ", "RECORDS", "SEQ", "LAST",
                       "LSN", "SLOT", "LAG", "OWNER", "NOTE"]  # fmt: skip
    assert rows[1][:5] == ["app", "postgres", "not", "running", "0"]
    assert rows[1][-5:] == ["-", "slot", "not", "being", "read"]  # OWNER, NOTE
    assert rows[2] == []  # a blank line between the tables
    assert rows[3][:2] == ["CONNECTOR", "STATE"]
    assert rows[4] == ["hooks", "not", "running", "-", "events", "0", "0.0s", "0", "0", "-"]


def test_watch_through_a_pipe_prints_a_reading_every_interval(tmp_path: Path, table: str) -> None:
    run = subprocess.Popen([*WEIR, "--config", _config(tmp_path, table), "--watch",
                            "--interval", "0.3"], stdout=subprocess.PIPE)  # fmt: skip
    assert run.stdout is not None
    out = _read_until(run.stdout.fileno(), b"weir status at ", 3).decode()
    run.send_signal(signal.SIGINT)
    out += run.communicate(timeout=30)[0].decode()
    assert run.returncode == 0  # ^C ends a watch
    readings = out.split("weir status at ")[1:]
    assert len(readings) >= 3, out
    for reading in readings:
        rows = _plain_rows(reading)
        assert re.fullmatch(r"\d\d:\d\d:\d\d, rates over 0\.\ds", " ".join(rows[0]))
        assert ["hooks", "not", "running", "-", "events"] in [r[:5] for r in rows]


def test_watch_on_a_terminal_redraws_in_place_until_interrupted(tmp_path: Path, table: str) -> None:
    config = _config(tmp_path, table)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERM")}
    run = subprocess.Popen([*WEIR, "--config", config, "--watch", "--interval", "0.3"],
                           stdin=follower, stdout=follower, stderr=follower,
                           env={**env, "TERM": "xterm-256color"})  # fmt: skip
    os.close(follower)
    try:
        drawn = _read_until(leader, b"weir status at", 3)
        run.send_signal(signal.SIGINT)
        # A terminal goes on reading: a pty nobody reads fills, and the watch's next frame
        # would wait on it for ever.
        deadline = time.monotonic() + 30
        while run.poll() is None and time.monotonic() < deadline:
            try:
                if select.select([leader], [], [], 0.1)[0]:
                    os.read(leader, 65536)
            except OSError:  # EIO: the watch ended and closed its side
                break
        assert run.wait(1) == 0  # ^C ends a watch
    finally:
        os.close(leader)
    text = drawn.decode()
    assert text.count("weir status at") >= 3, text  # redrawn
    assert "\x1b[1A" in text or "\x1b[A" in text or re.search(r"\x1b\[\d+A", text), text  # in place
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"hooks +not running +- +events", screen), screen
    assert "─" in screen  # a terminal's table has its header ruled
