"""A `weir run` process killed with SIGKILL under a steady write load loses and doubles nothing."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.helpers.capture import count_events, events, records, wait_for
from tests.helpers.load import WeirProcess, create_load_table, load_with_interruptions


@pytest.mark.slow
def test_sigkill_under_load_then_restart_stores_every_change_once(
    tmp_path: Path, db_url: str
) -> None:
    create_load_table(db_url)
    config = tmp_path / "weir.yaml"
    config.write_text(
        f"sources:\n  - {{name: app, kind: postgres, url: '{db_url}', tables: [public.load]}}\n"
    )
    with WeirProcess(config, tmp_path / "weir.log") as weir:
        # killed twice in the middle of the load
        expected = load_with_interruptions(db_url, 5000, [1500, 3500], weir.kill_and_restart)
        wait_for(
            lambda: count_events(db_url) >= len(expected), timeout=120, what="all changes stored"
        )
        time.sleep(0.5)  # anything more would be a duplicate
        weir.stop()
    evs = events(db_url)
    got = [(e["action"], e["record_id"], e["record"].get("v")) for e in evs]
    assert len(got) == len(expected)
    assert got == expected
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    with psycopg.connect(db_url) as conn:
        table = {r[0]: r[1] for r in conn.execute("SELECT id, v FROM load")}
    assert {int(r["record_id"]): r["record"]["v"] for r in records(db_url)} == table
    assert weir.log_text().count("streaming from slot") == 3
