"""Raw JetStream publishing: per-message PubAcks against batched publishing (ADR-50), one server.

Every variant publishes ``--messages`` messages of ``--size`` bytes, each with its own
``Nats-Msg-Id`` and a subject shaped like Weir's, into a fresh file stream (``allow_atomic`` and
``allow_batched`` set on all of them, so the store is the same), on one nats-server with
JetStream, and waits until the server has acknowledged all of them:

- ``async``: what Weir's NATS sink does: each message published with a reply subject of its own,
  in batches of 500 whose PubAcks one task awaits, at most ``--window`` messages unacknowledged
  (the forwarder's 8 batches of 500 in flight);
- ``nats_py``: nats-py's ``js.publish_async`` with ``publish_async_max_pending=--window`` (the
  e2e bench's ceiling);
- ``atomic_N``: atomic batches of N messages (``Nats-Batch-Id``, ``Nats-Batch-Sequence``,
  ``Nats-Batch-Commit: 1`` on the last; a reply on the first and the last message only), at most
  ``--window`` messages in unacknowledged batches (nats-server >= 2.12);
- ``fast_N``: fast-ingest batches of N messages (reply subject
  ``<inbox>.<flow>.fail.<seq>.<op>.$FI``, an end-of-batch commit), same window (>= 2.14).

Rounds alternate the variants; the machine is shared, so only ratios within a round mean
much. Each variant reports messages/s and the CPU time of this client and of nats-server (from
/proc) per message.

    .venv/bin/python bench/nats_publish.py [--messages 200000] [--rounds 3]

Prints one JSON line and appends it to bench/results/nats_publish.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import nats
import orjson
from common import record
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from devkit.embedded import EmbeddedNats

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Acks:
    """One inbox for every reply; each awaited reply resolves a future keyed by its token."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.inbox = nc.new_inbox() + "."
        self.waiting: dict[str, asyncio.Future[bytes]] = {}
        self.ids = itertools.count()

    async def start(self) -> None:
        await self.nc.subscribe(self.inbox + ">", cb=self.on_reply, pending_msgs_limit=-1)

    async def on_reply(self, msg: Msg) -> None:
        fut = self.waiting.pop(msg.subject[len(self.inbox) :], None)
        if fut is not None and not fut.done():
            fut.set_result(msg.data)

    def expect(self, token: str) -> asyncio.Future[bytes]:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting[token] = fut
        return fut


def check(data: bytes, count: int | None = None) -> None:
    resp = orjson.loads(data)
    if "error" in resp:
        raise RuntimeError(f"JetStream: {resp['error']}")
    if count is not None and resp.get("count") != count:
        raise RuntimeError(f"batch ack for {resp.get('count')} messages, not {count}: {resp}")


class Window:
    """At most ``limit`` messages unacknowledged; a failed ack fails the run."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.out: set[asyncio.Future[Any]] = set()
        self.held = 0

    async def admit(self, n: int, fut: asyncio.Future[Any]) -> None:
        self.out.add(fut)
        self.held += n
        fut.add_done_callback(lambda f: self._release(f, n))
        while self.held >= self.limit:
            done, _ = await asyncio.wait(self.out, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                f.result()

    def _release(self, fut: asyncio.Future[Any], n: int) -> None:
        self.out.discard(fut)
        self.held -= n

    async def drain(self) -> None:
        for f in list(self.out):
            await f
        while self.out:
            await asyncio.wait(self.out)


def subject(i: int) -> str:
    return f"sequin-events.bench.app.postgres.public:bench.{i % 5000}.inserted"


async def run_async(nc: Client, acks: Acks, n: int, body: bytes, window: int, size: int) -> None:
    """As Weir's sink: batches of ``size`` messages, a future for each PubAck, one task per
    batch awaiting them all."""
    win = Window(window)
    for lo in range(0, n, size):
        futs = []
        for i in range(lo, min(n, lo + size)):
            token = str(next(acks.ids))
            futs.append(acks.expect(token))
            await nc.publish(subject(i), body, reply=acks.inbox + token,
                             headers={"Nats-Msg-Id": f"bench:{i}"})  # fmt: skip
        await win.admit(len(futs), asyncio.ensure_future(_all(futs)))
    await win.drain()


async def _all(futs: list[asyncio.Future[bytes]]) -> None:
    await asyncio.wait(futs)
    for f in futs:
        check(f.result())


async def _checked(fut: asyncio.Future[bytes], count: int | None = None) -> None:
    check(await fut, count)


async def run_nats_py(nc: Client, _: Acks, n: int, body: bytes, window: int, __: int) -> None:
    js = nc.jetstream(publish_async_max_pending=window)
    for i in range(n):
        await js.publish_async(subject(i), body, headers={"Nats-Msg-Id": f"bench:{i}"})
    await js.publish_async_completed()


async def run_atomic(nc: Client, acks: Acks, n: int, body: bytes, window: int, size: int) -> None:
    win = Window(window)
    for lo in range(0, n, size):
        count = min(size, n - lo)
        batch = f"b{next(acks.ids)}"
        first, last = acks.expect(batch + ".f"), acks.expect(batch + ".l")
        for j in range(count):
            headers = {"Nats-Msg-Id": f"bench:{lo + j}", "Nats-Batch-Id": batch,
                       "Nats-Batch-Sequence": str(j + 1)}  # fmt: skip
            reply = ""
            if j == count - 1:
                headers["Nats-Batch-Commit"] = "1"
                reply = acks.inbox + batch + ".l"
            elif j == 0:
                reply = acks.inbox + batch + ".f"
            await nc.publish(subject(lo + j), body, reply=reply, headers=headers)
        if count == 1:
            first.cancel()
            acks.waiting.pop(batch + ".f", None)
            both: asyncio.Future[Any] = asyncio.ensure_future(_checked(last, 1))
        else:
            both = asyncio.ensure_future(_both(first, last, count))
        await win.admit(count, both)
    await win.drain()


async def _both(first: asyncio.Future[bytes], last: asyncio.Future[bytes], count: int) -> None:
    data = await first
    if data:
        check(data)
    check(await last, count)


async def run_fast(nc: Client, acks: Acks, n: int, body: bytes, window: int, size: int) -> None:
    """Fast-ingest batches, each with its own inbox token (the server's batch id); flow acks
    are not awaited one by one, only the commit's PubAck (the window bounds what is out)."""
    win = Window(window)
    flow = max(1, size // 2)
    for lo in range(0, n, size):
        count = min(size, n - lo)
        batch = f"f{next(acks.ids)}"
        prefix = f"{acks.inbox}{batch}.{flow}.fail."
        done = acks.expect(f"{batch}.{flow}.fail.{count + 1}.3.$FI")
        for j in range(count):
            reply = f"{prefix}{j + 1}.{0 if j == 0 else 1}.$FI"  # op 0 starts the batch, 1 adds
            await nc.publish(subject(lo + j), body, reply=reply,
                             headers={"Nats-Msg-Id": f"bench:{lo + j}"})  # fmt: skip
        await nc.publish(subject(lo), b"", reply=f"{prefix}{count + 1}.3.$FI")
        await win.admit(count, asyncio.ensure_future(_checked(done, count)))
    await win.drain()


Runner = Callable[..., Awaitable[None]]
VARIANTS: dict[str, tuple[Runner, int]] = {
    "async": (run_async, 500),
    "nats_py": (run_nats_py, 0),
    "atomic_100": (run_atomic, 100),
    "atomic_500": (run_atomic, 500),
    "atomic_1000": (run_atomic, 1000),
    "fast_500": (run_fast, 500),
}


async def measure(url: str, server_pid: int, name: str, n: int, body: bytes, window: int,
                  stream: str) -> dict[str, float]:  # fmt: skip
    runner, size = VARIANTS[name]
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=stream, subjects=["sequin-events.>"], allow_atomic=True,
                                     allow_batched=True))  # fmt: skip
    acks = Acks(nc)
    await acks.start()
    await nc.flush()
    cpu0, srv0, t0 = time.process_time(), cpu_of(server_pid), time.perf_counter()
    await runner(nc, acks, n, body, window, size)
    seconds = time.perf_counter() - t0
    cpu, srv = time.process_time() - cpu0, cpu_of(server_pid) - srv0
    state = (await js.stream_info(stream)).state
    if state.messages != n:
        raise RuntimeError(f"{name}: the stream holds {state.messages} messages, not {n}")
    await js.delete_stream(stream)
    await nc.close()
    return {"per_s": n / seconds, "client_us": cpu * 1e6 / n, "server_us": srv * 1e6 / n}


async def supports(url: str, flag: str) -> bool:
    """Whether the server keeps a stream's ``flag`` (an older one drops unknown fields)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.add_stream(StreamConfig(name="PROBE", subjects=["probe"], **{flag: True}))
        await js.delete_stream("PROBE")
        return bool(getattr(info.config, flag, False))
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=500)
    parser.add_argument("--window", type=int, default=4000, help="messages unacknowledged")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    names = args.variants.split(",")
    body = b"x" * args.size
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with EmbeddedNats() as ns:
        assert ns.proc is not None
        version = ""
        if not asyncio.run(supports(ns.url, "allow_batched")):
            names = [v for v in names if not v.startswith("fast")]
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                got = asyncio.run(measure(ns.url, ns.proc.pid, name, args.messages, body,
                                          args.window, f"B{r}{name.upper()}"))  # fmt: skip
                rows[name].append(got)
                print(name, {k: round(v, 1) for k, v in got.items()}, file=sys.stderr)
        version = asyncio.run(_version(ns.url))
    base = rows.get("async")
    result: dict[str, Any] = {
        "bench": "nats_publish",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "server": version,
        "messages": args.messages,
        "bytes": args.size,
        "window": args.window,
        "rounds": args.rounds,
        "variants": {},
    }
    for name in names:
        got = rows[name]
        entry: dict[str, Any] = {k: round(statistics.median(g[k] for g in got), 1) for k in got[0]}
        entry["per_s_runs"] = [round(g["per_s"]) for g in got]
        if base is not None:  # same round, same server: the ratio to Weir's way
            entry["ratio_to_async"] = [
                round(g["per_s"] / b["per_s"], 2) for g, b in zip(got, base, strict=True)
            ]
        result["variants"][name] = entry
    record(result)


async def _version(url: str) -> str:
    nc = await nats.connect(url)
    version = str(nc._server_info.get("version", ""))
    await nc.close()
    return version


if __name__ == "__main__":
    main()
