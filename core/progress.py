"""Progress of long work (seed, backfill): a ``rich`` bar with the rate and the time left, redrawn
in place on a terminal (stderr), otherwise a line every ``every`` seconds through the log
(systemd, containers, CI). While a bar is drawn, log lines print above it (core/redact.py's
handler writes to the ``sys.stderr`` the bar redirects). One bar at a time in a process: work
that starts while another's bar is drawn (``weir run``'s backfills of two sources) reports
through the log.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from types import TracebackType
from typing import TextIO

from rich import progress as bars
from rich.console import Console
from rich.text import Text

log = logging.getLogger("weir.progress")

_terminal = threading.Lock()  # held while a bar is drawn


class Progress:
    """``update(done)`` as the work goes, ``finish(summary)`` when it is done; used as a context
    manager, a bar is taken off when the work stops unfinished. A ``total`` of 0 is unknown: a
    count and a rate, no bar. The rate is rich's: of the updates of the last 30 seconds after
    the first (a backfill that resumes at a row counts from there).

    The work is ``label`` (Weir's words) of ``name`` (a table), which the log lines carry as an
    argument of its own, as every line names a table: a name of the config's is printed as it
    is, also when a password is the same word (core/logs.py), and Weir's words are never
    searched for one (its lines, handed over whole as an argument, read ``backfill public.***``
    and ``1,000 ***`` with a password ``orders`` or ``rows``; found by an outside tryout)."""

    def __init__(
        self, label: str, total: int, *, name: str = "", unit: str = "rows", every: float = 10.0,
        out: TextIO | None = None,
    ) -> None:  # fmt: skip
        self.label = f"{label} {name}" if name else label
        self._name = (label, name)
        self.total = total
        self.unit = unit
        self.every = every
        self.done = 0
        console = Console(file=out) if out is not None else Console(stderr=True)
        self._drawn = console.is_terminal and _terminal.acquire(blocking=False)
        self._shown = float("-inf")  # the first update logs where the work starts
        self._bars = bars.Progress(*self._columns(), console=console, disable=not self._drawn,
                                   refresh_per_second=5)  # fmt: skip
        self._task = self._bars.add_task(self.label, total=total or None)
        self._bars.start()

    def _columns(self) -> list[str | bars.ProgressColumn]:
        count = f"{{task.completed:,.0f}}{'/{task.total:,.0f}' if self.total else ''} {self.unit}"
        if not self.total:
            return ["{task.description}", count, _Rate(self.unit), bars.TimeElapsedColumn()]
        return ["{task.description}", bars.BarColumn(), bars.TaskProgressColumn(), count,
                _Rate(self.unit), "eta", bars.TimeRemainingColumn()]  # fmt: skip

    def update(self, done: int) -> None:
        self.done = done
        self._bars.update(self._task, completed=done)
        now = time.monotonic()
        if not self._drawn and now - self._shown >= self.every:
            self._say("  " + self._where())
            self._shown = now

    def _where(self) -> str:
        """Where the work stands: the percentage, the count, the rate and the time left."""
        task = self._bars.tasks[0]
        rate = _rate(task, self.unit)
        if not self.total:
            return "  ".join(p for p in (f"{self.done:,} {self.unit}", rate) if p)
        pct = min(100.0, 100.0 * self.done / self.total)
        left = task.time_remaining
        eta = "" if left is None else f"eta {timedelta(seconds=round(left))}"
        parts = (f"{pct:3.0f}%", f"{self.done:,}/{self.total:,} {self.unit}", rate, eta)
        return "  ".join(p for p in parts if p)

    def _say(self, words: str) -> None:
        """A log line of the work: its label, then Weir's own ``words``."""
        label, name = self._name
        if name:  # Weir's words are the format: a % in them is written %%
            log.info(label.replace("%", "%%") + " %s" + words.replace("%", "%%"), name)
        else:
            log.info(label + words)  # without arguments, nothing is formatted

    def finish(self, summary: str) -> None:
        """The work's last line: ``summary`` is Weir's own words (counts)."""
        self.close()
        self._say(": " + summary)

    def close(self) -> None:
        """Takes the bar off the live display (its last drawing stays), once."""
        if self._drawn:
            self._bars.stop()
            self._drawn = False
            _terminal.release()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _rate(task: bars.Task, unit: str) -> str:
    speed = task.speed
    return "" if speed is None else f"{speed:,.0f} {unit}/s"


class _Rate(bars.ProgressColumn):
    """The rate in the work's own unit (rich's own columns speak of bytes)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: bars.Task) -> Text:
        return Text(_rate(task, self.unit), "progress.data.speed")
