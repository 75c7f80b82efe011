"""Progress of seed and backfill (core/progress.py): a bar with the rate and the time left on a
terminal, log lines with the rate elsewhere."""

from __future__ import annotations

import io
import logging
import re
import time

import pytest

from core.progress import Progress


class Terminal(io.StringIO):
    """What rich takes for a terminal (it asks ``isatty``)."""

    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_log_line_every_few_seconds_with_the_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = io.StringIO()
    caplog.set_level(logging.INFO, "weir.progress")
    with Progress("backfill public.t", 1000, every=0.2, out=out) as progress:
        progress.update(100)  # a resumed backfill: the rate counts from here
        for done in range(200, 600, 100):
            time.sleep(0.1)
            progress.update(done)
        progress.finish("500 rows read")
    assert out.getvalue() == ""  # no bar, no control codes
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "backfill public.t   10%  100/1,000 rows"  # where it starts: no rate yet
    assert 2 <= len(lines) <= 4, lines  # then every 0.2s of the 0.4s, and the summary
    assert re.fullmatch(r"backfill public.t   \d0%  \d00/1,000 rows  \d+ rows/s  eta 0:00:0\d",
                        lines[1]), lines  # fmt: skip
    rate = int(lines[1].split("  ")[3].split()[0])
    assert 500 <= rate <= 1100, lines  # 100 rows every 0.1s
    assert lines[-1] == "backfill public.t: 500 rows read"


def test_an_unknown_total_is_a_count_and_a_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "weir.progress")
    with Progress("seed", 0, unit="changes", every=0.1, out=io.StringIO()) as progress:
        for done in (1000, 2000, 3000):
            progress.update(done)
            time.sleep(0.1)
    assert re.fullmatch(r"seed  3,000 changes  [\d,]+ changes/s", caplog.records[-1].getMessage())


def test_on_a_terminal_a_bar_with_the_percentage_rate_and_time_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "weir.progress")
    out = Terminal()
    with Progress("backfill public.t", 1000, every=0.0, out=out) as progress:
        for done in (100, 150, 200, 250):  # 50 rows every 0.1s
            progress.update(done)
            time.sleep(0.1)
        time.sleep(0.3)  # redrawn 5 times a second
        drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # colours, cursor moves
    assert re.search(r"backfill public\.t ━+[╸╺]?━* +25% 250/1,000 rows +\d{3} rows/s +"
                     r"eta 0:00:\d\d", drawn), drawn  # fmt: skip
    assert not caplog.records  # the bar, not log lines
    assert out.getvalue().endswith("\x1b[?25h")  # the bar stopped and gave the cursor back


def test_one_bar_at_a_time_the_others_log() -> None:
    first, second = Terminal(), Terminal()
    with Progress("a", 10, out=first) as a, Progress("b", 10, out=second) as b:
        a.update(1)
        b.update(1)
    assert "a" in first.getvalue()
    assert second.getvalue() == ""
    with Progress("c", 10, out=second) as c:  # the terminal is free again
        c.update(1)
    assert "c" in second.getvalue()
