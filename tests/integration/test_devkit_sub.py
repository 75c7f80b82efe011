"""``python -m devkit.sub URL SUBJECT`` (deploy/compose.yaml's header): what is published on
the subject, a line per message, until Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import nats

from devkit.embedded import EmbeddedNats


async def _publish(url: str, subject: str, payload: bytes) -> None:
    nc = await nats.connect(url)
    try:
        await nc.publish(subject, payload)
        await nc.flush()
    finally:
        await nc.close()


def test_sub_prints_each_message_on_one_line_until_ctrl_c(nats_server: EmbeddedNats) -> None:
    sub = subprocess.Popen([sys.executable, "-m", "devkit.sub", nats_server.url, "weir-sub.>"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert sub.stderr is not None and sub.stdout is not None
        said = sub.stderr.readline()  # once it says so, the server has the subscription
        assert said.startswith("devkit.sub: subscribed to weir-sub.> on "), said
        asyncio.run(_publish(nats_server.url, "weir-sub.users.1", b'{"a": 1}\n{"b": 2}'))
        assert sub.stdout.readline() == 'weir-sub.users.1 {"a": 1}\\n{"b": 2}\n'
        sub.send_signal(signal.SIGINT)  # Ctrl-C: ends quietly
        assert sub.wait(timeout=30) == 0
        assert sub.stderr.read() == ""
    finally:
        sub.kill()
        sub.wait()
