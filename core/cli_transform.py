"""``weir transform test``: a connector's (or HTTP pull consumer's) steps run over the latest
messages it takes from the store, each input beside what its steps make of it (the payload and
route, dropped, or why it fails) and what they cost (docs/transforms.md). Nothing is sent and
no cursor moves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, NamedTuple

from core.commands import load_or_exit, reach_store
from core.config.model import WeirConfig
from core.config.sources import HttpSource, PostgresSource
from core.envelope import Message
from core.redact import said
from core.steps.compile import StepFailed
from core.steps.run import Steps
from core.store import Store
from core.store.connectors import with_api_connectors
from core.store.consumers import consumer_key, stored_consumers
from core.store.reader import StreamReader
from core.store.selection import selection
from core.templates import Template, Unrouted

WINDOW = 100_000  # seqs of each source looked through for the latest messages


class _Taker(NamedTuple):
    """What ``weir transform test`` runs: a connector's or an HTTP pull consumer's steps, and
    which stored messages it takes."""

    what: str  # "connector NAME" or "consumer NAME"
    key: str  # its reader's name in the store
    stream: str
    steps: list[Any]
    routes: dict[str, Any]
    where: Any  # core/store/selection.py
    sources: list[PostgresSource | HttpSource]
    places: Template | None = None  # a connector's, made per message


def cmd_transform(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, api=False)
    store = reach_store(cfg)
    if args.consumer is not None:
        taker = _consumer(cfg, store, args.consumer)
    else:
        taker = _connector(cfg, store, args.connector)
    if isinstance(taker, str):
        print(f"weir transform test: {taker}", file=sys.stderr)
        return 2
    if not taker.steps:
        print(f"weir transform test: {taker.what} has no steps: its messages go as they are "
              "stored", file=sys.stderr)  # fmt: skip
        return 2
    urls = {str(s.sync_id): s.url.get_secret_value() for s in taker.sources
            if isinstance(s, PostgresSource)}  # fmt: skip
    steps = Steps(taker.steps, taker.routes, taker.stream == "records",
                  cfg.functions.timeout.total_seconds(), urls)  # fmt: skip
    msgs = asyncio.run(_latest(store, taker, args.limit))
    if not msgs:
        print(f"{taker.what}: none of the last {WINDOW:,} stored messages of each source is "
              "one it takes")  # fmt: skip
        return 0
    counts = {"sent": 0, "dropped": 0, "failed": 0}
    t0 = time.perf_counter()
    outcomes = asyncio.run(_apply(steps, msgs))
    spent = time.perf_counter() - t0
    places = taker.places
    for m, out in zip(msgs, outcomes, strict=True):
        if isinstance(out, Message) and places is not None:
            try:  # as the sink would: a message whose route gives it no place fails
                places.render(out)
            except Unrouted as e:
                out = StepFailed(*e.args)
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


def _connector(cfg: WeirConfig, store: Store, name: str) -> _Taker | str:
    """The connector of the file or the API named ``name``, or why there is none."""
    cfg = with_api_connectors(cfg, store)
    c = next((c for c in cfg.connectors if c.name == name), None)
    if c is None:
        known = ", ".join(c.name for c in cfg.connectors) or "none"
        return f"no connector named {name!r} (there are: {known})"
    return _Taker(f"connector {c.name!r}", c.name, c.stream, c.steps, type(c).ROUTES,
                  selection(c.collections, c.actions, c.filters), cfg.sources_of(c),
                  c.places())  # fmt: skip


def _consumer(cfg: WeirConfig, store: Store, name: str) -> _Taker | str:
    """The HTTP pull consumer of the file or the API named ``name``, or why there is none."""
    known = {c.name: c for c in stored_consumers(store)} | {c.name: c for c in cfg.consumers}
    c = known.get(name)
    if c is None:
        return f"no consumer named {name!r} (there are: {', '.join(sorted(known)) or 'none'})"
    where = selection([c.filters.collection_id], None, [], [c.filters.resource_id])
    return _Taker(f"consumer {c.name!r}", consumer_key(c.name), c.stream, c.steps, {}, where,
                  cfg.sources_of(c))  # fmt: skip


async def _apply(steps: Steps, msgs: list[Message]) -> list[Any]:
    try:
        return await steps.apply(msgs)
    finally:
        await steps.close()


def _routes(route: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in route.items())


async def _latest(store: Store, taker: _Taker, limit: int) -> list[Message]:
    """The last ``limit`` messages it takes of each source (its selection, not its shards),
    oldest first."""
    out: list[Message] = []
    for src in taker.sources:
        reader = StreamReader(store, taker.key, taker.stream, taker.where, str(src.sync_id),
                              src.provider)  # fmt: skip
        await reader.open()
        try:
            head = await reader.head()
            got = await reader.fetch(max(0, head - WINDOW), head, WINDOW)
        finally:
            await reader.close()
        out += got[-limit:]
    return out


def _count(text: str) -> int:
    """A --limit: a whole number of 1 or more (0 took every stored message: ``got[-0:]``)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(said("must be a whole number of 1 or more, not %r", text))
    return int(text)


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "transform", help="a connector's or consumer's steps (filter, transform, route, enrich)"
    )
    tsub = p.add_subparsers(dest="transform_command", required=True)
    t = tsub.add_parser(
        "test", help="run a connector's or consumer's steps over its latest stored messages"
    )
    t.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    who = t.add_mutually_exclusive_group(required=True)
    who.add_argument("--connector", help="the connector whose steps run")
    who.add_argument("--consumer", help="the HTTP pull consumer whose steps run")
    t.add_argument("--limit", type=_count, default=10,
                   help="messages of each source (default 10)")  # fmt: skip
    t.set_defaults(func=cmd_transform)
