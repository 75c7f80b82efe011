"""``weir failed list|show|retry|discard`` and ``weir connector pause|resume``: the management
API's actions from the command line, straight on the store (core/store/operate.py), so they
work whether or not ``weir run`` serves the API.

A failed list is named by its connector, or ``consumer:NAME`` for an HTTP pull consumer's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
import psycopg

from core.commands import load_or_exit, reach_store
from core.config.model import WeirConfig
from core.store import SESSION, AConn, Store
from core.store import status as stored
from core.store.connectors import with_api_connectors
from core.store.consumers import CONSUMER_PREFIX
from core.store.operate import Operations

T = TypeVar("T")


def _on_store(cfg: WeirConfig, act: Callable[[Operations, AConn], Awaitable[T]]) -> T:
    store = reach_store(cfg)

    async def run() -> T:
        async with await psycopg.AsyncConnection.connect(
            store.url, autocommit=True, application_name="weir:cli", options=SESSION
        ) as conn:
            return await act(Operations(store), conn)

    return asyncio.run(run())


def _list_or_exit(cfg: WeirConfig, name: str) -> str:
    """``name`` when it names a connector (of the file or made over the API) or a consumer
    (checked by the store: consumers may be made over the API); exit 2 otherwise."""
    if name.startswith(CONSUMER_PREFIX):
        if _on_store(cfg, lambda o, c: o.has_consumer(c, name)):
            return name
        print(f"weir: no HTTP pull consumer named {name.removeprefix(CONSUMER_PREFIX)!r} in the "
              "store", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    cfg = with_api_connectors(cfg, reach_store(cfg))
    if name in {c.name for c in cfg.connectors}:
        return name
    known = ", ".join(c.name for c in cfg.connectors) or "none"
    print(f"weir: no connector named {name!r} (there are: {known}; an HTTP pull consumer's "
          "list is consumer:NAME)", file=sys.stderr)  # fmt: skip
    raise SystemExit(2)


def _chosen(args: argparse.Namespace) -> list[str] | None:
    if bool(args.id) == bool(args.all):
        print(f"weir failed {args.failed_command}: give entry ids (SOURCE:SEQ) or --all",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    return None if args.all else list(args.id)


def cmd_failed(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, api=False)
    name = _list_or_exit(cfg, args.name)
    what = args.failed_command
    ids: list[str] | None = None
    count = 0
    if what == "list":
        data, next_ = _on_store(cfg, lambda o, c: o.failed(c, name, args.limit, args.after))
        _print_entries(name, data, next_)
    elif what == "show":
        entry = _on_store(cfg, lambda o, c: o.failed_one(c, name, args.id))
        print(orjson.dumps(entry, option=orjson.OPT_INDENT_2).decode())
    elif what == "retry":
        ids = _chosen(args)
        count = _on_store(cfg, lambda o, c: o.retry(c, name, ids))
        later = "sent again by the connector; each leaves the list once delivered"
        if name.startswith(CONSUMER_PREFIX):
            later = "back in its queue"
        elif name in stored.works(Store(cfg.store_url, cfg.store.schema_)).paused:
            later = "to be sent again once the connector is resumed (it is paused)"
        print(f"{name}: {count} failed messages {later}")
    else:
        ids = _chosen(args)
        count = _on_store(cfg, lambda o, c: o.discard(c, name, ids))
        print(f"{name}: {count} failed messages discarded")
    if ids is not None and count < len(set(ids)):
        print(f"weir failed {what}: {len(set(ids)) - count} of the ids given are not on the "
              f"list of {name} (weir failed list {name})", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _print_entries(name: str, data: list[dict[str, Any]], next_: str | None) -> None:
    if not data:
        print(f"{name}: the failed list is empty")
        return
    for e in data:
        retry = "  (retry asked)" if e["retry_requested"] else ""
        print(f"{e['id']}  {e['failed_at']}  attempts {e['attempts']}{retry}  {e['error']}")
    if next_:
        print(f"… more: weir failed list {name} --after {next_}")


def cmd_connector(args: argparse.Namespace) -> int:
    cfg = load_or_exit(args.config, api=False)
    name = args.name
    if name.startswith(CONSUMER_PREFIX):
        print("weir connector: an HTTP pull consumer cannot be paused", file=sys.stderr)
        return 2
    _list_or_exit(cfg, name)  # exits 2 saying what there is
    paused = args.connector_command == "pause"
    _on_store(cfg, lambda o, c: o.set_paused(c, name, paused))
    if paused:
        print(f"connector {name}: paused; every instance drains and stops it within a second, "
              f"its cursor stays (weir connector resume {name})")  # fmt: skip
    else:
        print(f"connector {name}: resumed; it goes on from its cursor within a second")
    return 0


def add_commands(sub: Any) -> None:
    """The ``failed`` and ``connector`` commands on the ``weir`` parser's subparsers."""
    p = sub.add_parser("failed", help="failed lists of connectors and consumers")
    fsub = p.add_subparsers(dest="failed_command", required=True)
    for what, text in (("list", "a page of a failed list"), ("show", "one entry with its message"),
                       ("retry", "send entries again, in order for their groups"),
                       ("discard", "delete entries for good")):  # fmt: skip
        f = fsub.add_parser(what, help=text)
        f.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
        f.add_argument("name", help="a connector, or consumer:NAME")
        if what == "list":
            f.add_argument("--limit", type=int, default=50, help="entries per page (default 50)")
            f.add_argument("--after", help="the entry id the page before ended with")
        elif what == "show":
            f.add_argument("id", help="an entry id, SOURCE:SEQ")
        else:
            f.add_argument("id", nargs="*", help="entry ids, SOURCE:SEQ")
            f.add_argument("--all", action="store_true", help="every entry of the list")
        f.set_defaults(func=cmd_failed)
    p = sub.add_parser("connector", help="pause or resume a connector")
    csub = p.add_subparsers(dest="connector_command", required=True)
    for what, text in (("pause", "stop it everywhere, its cursor kept"),
                       ("resume", "run it again from its cursor")):  # fmt: skip
        c = csub.add_parser(what, help=text)
        c.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
        c.add_argument("name", help="a connector of the config")
        c.set_defaults(func=cmd_connector)
