"""`./dev demo` (python -m devkit.demo), the README's first command: a sample table through an
embedded Postgres to an embedded NATS, every subject printed."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_prints_every_change_and_exits_0() -> None:
    done = subprocess.run([sys.executable, "-m", "devkit.demo"], capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    subjects = re.findall(r"^(sequin-(?:events|records)\.\S+)$", done.stdout, re.M)
    by_record: dict[str, list[str]] = {}  # each record's events, in the order received
    for s in subjects:
        if s.startswith("sequin-events."):
            record_id, action = s.rsplit(".", 2)[-2:]
            by_record.setdefault(record_id, []).append(action)
    assert by_record == {"1": ["inserted", "updated"], "2": ["inserted"],
                         "3": ["inserted", "deleted"]}  # fmt: skip
    assert {s.rsplit(".", 1)[-1] for s in subjects if s.startswith("sequin-records.")} == {
        "1", "2", "3"}  # fmt: skip
    assert "5 events (expected 5); the records' latest versions as in the table" in done.stdout
