"""``weir transform test``: a connector's steps run over the latest messages it takes from the
store, each input beside what its steps make of it (the payload and route, dropped, or why it
fails) and what they cost (docs/transforms.md). Nothing is sent and no cursor moves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from core.commands import load_or_exit, reach_store
from core.config.model import Connector, WeirConfig
from core.config.sources import PostgresSource
from core.envelope import Message
from core.steps.run import Steps
from core.store import Store
from core.store.connectors import with_api_connectors
from core.store.reader import StreamReader
from core.store.selection import selection

WINDOW = 100_000  # seqs of each source looked through for the latest messages


def cmd_transform(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, api=False)
    store = reach_store(cfg)
    cfg = with_api_connectors(cfg, store)
    c = next((c for c in cfg.connectors if c.name == args.connector), None)
    if c is None:
        known = ", ".join(c.name for c in cfg.connectors) or "none"
        print(f"weir transform test: no connector named {args.connector!r} (there are: {known})",
              file=sys.stderr)  # fmt: skip
        return 2
    if not c.steps:
        print(f"weir transform test: connector {c.name!r} has no steps: its messages go as "
              "they are stored", file=sys.stderr)  # fmt: skip
        return 2
    urls = {str(s.sync_id): s.url.get_secret_value() for s in cfg.sources_of(c)
            if isinstance(s, PostgresSource)}  # fmt: skip
    steps = Steps(c.steps, type(c).ROUTES, c.stream == "records",
                  cfg.functions.timeout.total_seconds(), urls)  # fmt: skip
    msgs = asyncio.run(_latest(cfg, store, c, args.limit))
    if not msgs:
        print(f"connector {c.name}: none of the last {WINDOW:,} stored messages of each source "
              "is one it takes")  # fmt: skip
        return 0
    counts = {"sent": 0, "dropped": 0, "failed": 0}
    t0 = time.perf_counter()
    outcomes = asyncio.run(_apply(steps, msgs))
    spent = time.perf_counter() - t0
    for m, out in zip(msgs, outcomes, strict=True):
        print(f"{m.sync_id}:{m.seq} in   {m.payload.decode()}")
        if isinstance(out, Message):
            counts["sent"] += 1
            route = f"  (route: {_routes(out.route)})" if out.route else ""
            print(f"{' ' * len(f'{m.sync_id}:{m.seq}')} out  {out.payload.decode()}{route}")
        else:
            counts["dropped" if out is None else "failed"] += 1
            said = "dropped" if out is None else f"fails: {out}"
            print(f"{' ' * len(f'{m.sync_id}:{m.seq}')} {said}")
    n = len(msgs)
    print(f"{n} messages: {counts['sent']} sent, {counts['dropped']} dropped, "
          f"{counts['failed']} failed; {1e6 * spent / n:.1f} us a message")  # fmt: skip
    return 0


async def _apply(steps: Steps, msgs: list[Message]) -> list[Any]:
    try:
        return await steps.apply(msgs)
    finally:
        await steps.close()


def _routes(route: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in route.items())


async def _latest(cfg: WeirConfig, store: Store, c: Connector, limit: int) -> list[Message]:
    """The last ``limit`` messages the connector takes of each source (its selection, not its
    shards), oldest first."""
    out: list[Message] = []
    where = selection(c.collections, c.actions, c.filters)
    for src in cfg.sources_of(c):
        reader = StreamReader(store, c.name, c.stream, where, str(src.sync_id), src.provider)
        await reader.open()
        try:
            head = await reader.head()
            got = await reader.fetch(max(0, head - WINDOW), head, WINDOW)
        finally:
            await reader.close()
        out += got[-limit:]
    return out


def add_commands(sub: Any) -> None:
    p = sub.add_parser("transform", help="a connector's steps (filter, transform, route)")
    tsub = p.add_subparsers(dest="transform_command", required=True)
    t = tsub.add_parser("test", help="run a connector's steps over its latest stored messages")
    t.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    t.add_argument("--connector", required=True, help="the connector whose steps run")
    t.add_argument("--limit", type=int, default=10, help="messages of each source (default 10)")
    t.set_defaults(func=cmd_transform)
