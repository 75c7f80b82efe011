"""Tables whose names need SQL quoting: written ``public."my.table"`` in ``tables:``,
``key_columns:`` and ``weir backfill --table``, captured and backfilled like any other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from core.config.model import WeirConfig
from core.runtime.service import prepare
from tests.helpers.capture import wait_for
from tests.helpers.weir import serving, store_events

DOTTED, SPACED = 'public."my.table"', '"My Schema".orders'


NONE_OLDER = "(0 not: equal to their record, or older than its version)"


def test_quoted_table_names_are_captured_and_backfilled(tmp_path: Path, db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute('CREATE TABLE "my.table" (id int PRIMARY KEY, v text)')
        conn.execute('CREATE SCHEMA "My Schema"')
        conn.execute('CREATE TABLE "My Schema".orders (n int NOT NULL, v text)')  # no key
        conn.execute('ALTER TABLE "My Schema".orders REPLICA IDENTITY FULL')
        conn.execute("""INSERT INTO "my.table" VALUES (1, 'old')""")
        conn.execute("""INSERT INTO "My Schema".orders VALUES (7, 'old')""")
    spec: dict[str, Any] = {"sources": [{
        "name": "app", "kind": "postgres", "url": db_url, "tables": [DOTTED, SPACED],
        "key_columns": {'"My Schema"."orders"': ["n"]}}]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(spec))
    prepare(WeirConfig.model_validate(spec))  # the store and slot, as weir run makes them

    def backfill(*tables: str) -> subprocess.CompletedProcess[str]:
        args = [a for t in tables for a in ("--table", t)]
        return subprocess.run(
            [sys.executable, "-m", "core.cli", "backfill", "--config", str(config),
             "--source", "app", *args], capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    done = backfill(DOTTED, '"My Schema"."orders"')
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{DOTTED}: 1 rows read, 1 written {NONE_OLDER}",
        f"My Schema.orders: 1 rows read, 1 written {NONE_OLDER}",
    ]
    with serving(WeirConfig.model_validate(spec)):
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("""INSERT INTO "my.table" VALUES (2, 'new')""")
            conn.execute("""UPDATE "My Schema".orders SET v = 'new' WHERE n = 7""")
        wait_for(lambda: len(store_events(db_url)) == 2, what="the two changes captured")
    assert sorted(e[1:] for e in store_events(db_url)) == [
        ("My Schema:orders", "7", "update"),
        ("public:my.table", "2", "insert"),
    ]
    refused = backfill("public.my.table")
    assert refused.returncode == 2
    assert "argument --table: 'public.my.table': tables are written schema.table" in refused.stderr
