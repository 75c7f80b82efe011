"""`weir status`'s tables (core/status_view.py) from a reading: what each column is called."""

from __future__ import annotations

import re
from datetime import datetime

from core.status_view import Reading, plain, sections
from core.store.status import CursorStatus, Works


def test_the_columns_say_what_each_number_counts() -> None:
    """A connector's messages not yet sent and how long the oldest has waited, and a consumer's
    messages queued and received but unacked: LAG, LAG AGE, PENDING and ACK PENDING, which a
    user could not tell apart (found by an outside tryout), say what they count."""
    works = Works()
    works.paused = {}
    cursors = [CursorStatus("hooks", "app", "events", 10, 1350, 10.3, 2, None),
               CursorStatus("consumer:jobs", "app", "events", 0, 500, 2.0, 0, None)]  # fmt: skip
    reading = Reading(datetime(2026, 11, 28), 1.0, [], cursors,
                      {(c.name, c.source): 0 for c in cursors}, {"hooks"}, {"jobs": (200, 7)},
                      [], works)  # fmt: skip
    tables = [[re.split(r"\s{2,}", line) for line in block.splitlines()]
              for block in plain(sections(reading, None)).strip().split("\n\n")]  # fmt: skip
    connectors, consumers = tables[1], tables[2]
    assert connectors[0] == ["CONNECTOR", "STATE", "SOURCE", "STREAM", "BEHIND", "BEHIND BY",
                             "RATE/S", "FAILED", "OWNER", "NOTE"]  # fmt: skip
    assert connectors[1][:6] == ["hooks", "not running", "app", "events", "1350", "10.3s"]
    assert connectors[2][:6] == ["consumer:jobs", "-", "app", "events", "500", "2.0s"]
    assert consumers == [["CONSUMER", "QUEUED", "UNACKED"], ["jobs", "200", "7"]]
