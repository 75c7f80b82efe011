"""The cost a message of a connector's steps (docs/transforms.md), next to jmespath and
simpleeval doing the same on the same messages, in one run.

Cases, each over the same 20,000 events-stream payloads as Weir stores them (a 10-field
record):
- ``filter_select``: a filter (`action != "delete" and record.total > 100`) and a select of five
  fields (`transform: {keep: [...]}`), as Steps run them: the payload read, both steps, the
  payload written; ``filter_select_jsonb``: the same with a jsonb column's value in each record
  (written with Postgres' spaces); ``filter_select_steps_only``: the two compiled closures
  alone on the read message; ``jmespath``: the same filter and select as one compiled jmespath
  expression on the read message; ``simpleeval``: the filter by simpleeval on it (no select);
- ``filter_only``: the filter alone (the payload is not written again);
- ``route``: a NATS subject template (`orders.{record.tenant}`);
- ``function``: a Python function (module:function) that drops two fields;
- ``enrich_batch_of_500``: an enrich step joining a ``customers`` row (an embedded Postgres on
  loopback; 1,000 customers), run on batches of 500 as a connector does: one query a batch.

    .venv/bin/python bench/transforms.py [--messages 20000]

Prints one JSON line (µs a message of each case) and appends it to
bench/results/transforms.jsonl. simpleeval is the bench extra's (pip install .[bench]); without
it that case is left out and the line says so.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jmespath
import orjson
import psycopg
from common import new_db, record

from connectors.nats.config import NatsConnector
from core.envelope import Message
from core.steps import functions
from core.steps.payload import load
from core.steps.run import Steps
from devkit.embedded import EmbeddedPostgres

FILTER = 'action != "delete" and record.total > 100'
KEEP = ["id", "tenant", "status", "total", "created_at"]
ROUTE = "orders.{record.tenant}"
FUNCTION = "bench_fn:shape"


# A jsonb column's value as Postgres writes it (spaces after ',' and ':')
JSONB = orjson.Fragment(b'{"size": 42, "price": 9.99, "tags": ["a", "b"], "dims": {"w": 1.5}}')


def messages(n: int, jsonb: bool = False) -> list[Message]:
    out = []
    for i in range(n):
        rec = {
            "id": i,
            "tenant": f"t{i % 7}",
            "status": "paid",
            "total": i % 300,
            "currency": "EUR",
            "created_at": "2026-11-28T10:00:00.123456Z",
            "customer": f"c{i}",
            "note": "x" * 40,
            "items": i % 5,
            "flag": i % 2 == 0,
        }
        if jsonb:
            rec["attrs"] = JSONB
        payload = orjson.dumps(
            {
                "record": rec,
                "changes": None,
                "action": "delete" if i % 10 == 0 else "insert",
                "metadata": {
                    "sync_id": "0b6c5e2a",
                    "provider": "postgres",
                    "collection_id": "public:orders",
                    "record_id": str(i),
                    "table_schema": "public",
                    "table_name": "orders",
                    "seq": i + 1,
                    "idempotency_key": f"0b6c5e2a:{i}:0",
                },
            }
        )
        out.append(Message("0b6c5e2a", "postgres", i + 1, "public:orders", "insert",
                           f"g{i}", f"k{i}", payload))  # fmt: skip
    return out


def per_message(fn: Callable[[Any], Any], items: list[Any]) -> float:
    """Best of 3 passes, µs an item."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - t0)
    return round(1e6 * best / len(items), 2)


def steps(spec: list[dict[str, Any]], sources: dict[str, str] | None = None) -> Steps:
    cfg = NatsConnector.model_validate({"name": "b", "type": "nats", "stream": "events",
                                        "steps": spec})  # fmt: skip
    return Steps(cfg.steps, NatsConnector.ROUTES, records=False, timeout=1.0, sources=sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    msgs = messages(args.messages)
    parsed = [load(m.payload) for m in msgs]
    with tempfile.TemporaryDirectory() as fdir:
        Path(fdir, "bench_fn.py").write_text(
            "def shape(action, record, changes, metadata):\n"
            "    r = {k: v for k, v in record.items() if k not in ('note', 'customer')}\n"
            "    return {'action': action, 'record': r, 'metadata': metadata}\n")  # fmt: skip
        functions.use_dir(Path(fdir))
        fs = steps([{"filter": FILTER}, {"transform": {"keep": KEEP}}])
        closures = [c.run for c in fs.compiled]

        def steps_only(m: dict[str, Any]) -> Any:
            m = dict(m, record=dict(m["record"]))
            for run in closures:
                m = run(m, {})
                if m is None:
                    return None
            return m

        found = jmespath.compile(
            "[?action != 'delete' && record.total > `100`].record.{id: id, tenant: tenant, "
            "status: status, total: total, created_at: created_at}")  # fmt: skip
        us = {
            "filter_select": per_message(fs.one, msgs),
            "filter_select_jsonb": per_message(fs.one, messages(args.messages, jsonb=True)),
            "filter_select_steps_only": per_message(steps_only, parsed),
            "jmespath": per_message(lambda m: found.search([m]), parsed),
            "filter_only": per_message(steps([{"filter": FILTER}]).one, msgs),
            "route": per_message(steps([{"route": {"subject": ROUTE}}]).one, msgs),
            "function": per_message(steps([{"transform": {"function": FUNCTION}}]).one, msgs),
            "read_and_write_only": per_message(lambda m: orjson.dumps(load(m.payload)), msgs),
        }
        functions.use_dir(None)
    result: dict[str, Any] = {
        "bench": "transforms",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} python {sys.version.split()[0]}",
        "messages": args.messages,
        "us_per_message": us,
        "target_filter_select_us": 2.0,
    }
    try:
        from simpleeval import SimpleEval  # the bench extra's
    except ImportError:
        result["simpleeval"] = "not installed (pip install .[bench])"
    else:
        ev = SimpleEval()
        tree = ev.parse("action != 'delete' and record['total'] > 100")

        def by_simpleeval(m: dict[str, Any]) -> Any:
            ev.names = m
            return ev.eval("", previously_parsed=tree)

        us["simpleeval_filter"] = per_message(by_simpleeval, parsed)
    us["enrich_batch_of_500"] = enrich_cost(msgs)
    record(result)


def enrich_cost(msgs: list[Message]) -> float:
    """µs a message of an enrich step over batches of 500 (its query and the merge)."""
    with EmbeddedPostgres() as pg:
        url = new_db(pg, "enrich", "CREATE TABLE customers (id int PRIMARY KEY, name text)")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO customers SELECT g, 'c' || g FROM generate_series(0, 999) g")
        spec = {"sql": "SELECT id, name FROM customers WHERE id = ANY(%(ids)s::int[])",
                "key": "record.items", "into": "customer"}  # fmt: skip
        joined = steps([{"enrich": spec}], {"0b6c5e2a": url})
        batches = [msgs[i : i + 500] for i in range(0, len(msgs), 500)]

        async def run() -> float:
            await joined.apply(batches[0])  # the connection, opened once
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                for b in batches:
                    await joined.apply(b)
                best = min(best, time.perf_counter() - t0)
            await joined.close()
            return round(1e6 * best / len(msgs), 2)

        return asyncio.run(run())


if __name__ == "__main__":
    main()
