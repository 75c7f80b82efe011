"""``.venv/bin/python -m devkit.sub URL SUBJECT``: every message NATS delivers on SUBJECT (a
wildcard such as ``'sequin-events.>'`` too), one line each, its subject then its payload, until
Ctrl-C. A core NATS subscription, as ``nats sub`` of the official CLI is (deploy/compose.yaml's
header): it sees what is published while it runs, not what a stream held before.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import TextIO

import nats
from nats.aio.msg import Msg


def line(msg: Msg) -> str:
    """The subject and the payload as text; a newline in it is written ``\\n``, so that a
    message is one line whatever it holds."""
    payload = msg.data.decode(errors="backslashreplace")
    return f"{msg.subject} {payload.replace(chr(10), chr(92) + 'n')}"


async def subscribe(url: str, subject: str, out: TextIO = sys.stdout) -> None:
    """Print what ``subject`` receives until cancelled. A server not up yet, or gone, is
    retried every 2 s, saying so on stderr (once per error, not each attempt)."""
    last: list[str] = []  # the last line said
    ending: list[bool] = []  # its close (Ctrl-C) disconnects too: not a line to say

    async def said(text: str) -> None:
        if last != [text]:
            print(f"devkit.sub: {text}", file=sys.stderr, flush=True)
            last[:] = [text]

    async def disconnected() -> None:
        if not ending:
            await said(f"disconnected from {url}, reconnecting")

    async def reconnected() -> None:
        await said(f"reconnected to {url}")

    async def error(e: Exception) -> None:
        await said(f"{url}: {type(e).__name__}: {e} (retrying; Ctrl-C ends)")

    async def on_msg(msg: Msg) -> None:
        print(line(msg), file=out, flush=True)

    stop = asyncio.Event()  # Ctrl-C or SIGTERM: a KeyboardInterrupt that arrived while the
    for sig in (signal.SIGINT, signal.SIGTERM):  # loop closed the connection left it hanging
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=-1,
                            disconnected_cb=disconnected, reconnected_cb=reconnected,
                            error_cb=error)  # fmt: skip
    try:
        await nc.subscribe(subject, cb=on_msg)
        await nc.flush()  # the server has the subscription: what is published now arrives
        await said(f"subscribed to {subject} on {url} (Ctrl-C ends)")
        await stop.wait()
    finally:
        ending.append(True)
        with contextlib.suppress(Exception):  # a server gone: nothing to close cleanly
            await asyncio.wait_for(nc.close(), 5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m devkit.sub",
        description="print each NATS message on SUBJECT, its subject and payload, until Ctrl-C",
    )
    p.add_argument("url", help="the server, e.g. nats://127.0.0.1:4222")
    p.add_argument("subject", help="a subject or wildcard, e.g. 'sequin-events.>'")
    args = p.parse_args(argv)
    try:
        asyncio.run(subscribe(args.url, args.subject))
    except KeyboardInterrupt:
        return 0
    except Exception as e:  # an unreachable server, a bad subject: one line
        print(f"devkit.sub: {args.url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
