"""Progress of long work (seed, backfill): a bar redrawn in place on a terminal, otherwise a
line every ``every`` seconds through the log (systemd, containers, CI)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger("weir.progress")


class Progress:
    def __init__(
        self, label: str, total: int, *, unit: str = "rows", every: float = 10.0,
        out: TextIO | None = None,
    ) -> None:  # fmt: skip
        self.label = label
        self.total = total
        self.unit = unit
        self.every = every
        self.out = out if out is not None else sys.stderr
        self.tty = self.out.isatty()
        self.started = time.monotonic()
        self._shown = 0.0
        self.done = 0

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        parts = [self.label]
        if self.total:
            pct = min(100.0, 100.0 * self.done / self.total)
            if self.tty:
                filled = int(pct / 4)
                parts.append("[" + "#" * filled + "-" * (25 - filled) + "]")
            parts.append(f"{pct:3.0f}%  {self.done:,}/{self.total:,} {self.unit}")
            if rate > 0 and self.done < self.total:
                parts.append(f"eta {(self.total - self.done) / rate:,.0f}s")
        else:
            parts.append(f"{self.done:,} {self.unit}")
        parts.append(f"{rate:,.0f} {self.unit}/s")
        return "  ".join(parts)

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if self.tty:
            if now - self._shown >= 0.2:
                self.out.write("\r" + self.line() + "\033[K")
                self.out.flush()
                self._shown = now
        elif now - self._shown >= self.every:
            log.info("%s", self.line())
            self._shown = now

    def finish(self, summary: str) -> None:
        if self.tty:
            self.out.write("\r" + self.line() + "\033[K\n")
        log.info("%s: %s", self.label, summary)
