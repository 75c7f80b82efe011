"""One source's stream within a connector: its reader, cursor, read-ahead and the broker
marks its cursor is saved with (core/engine/forwarder.py keeps the rules that move them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from core.engine.ports import Reader
from core.envelope import BrokerMark

MAX_MARKS = 64


class Lane:
    """One source's stream within a connector: its reader, cursor and read-ahead."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.fetched = 0  # every seq up to here has been read (and maybe filtered out)
        self.head = 0  # the stream's last seq, as last seen
        self.hungry = True
        self.ask = True  # its head is asked of the store, not taken from the commits heard
        self.outstanding: deque[int] = deque()  # seqs read and not yet settled, ascending
        self.settled: set[int] = set()  # settled seqs still behind an outstanding one
        self.marks: deque[tuple[BrokerMark, int]] = deque()  # (mark at dispatch, max seq)
        self.resolved: list[tuple[int, str]] = []  # (seq, key): retried ones done, to take off
        self.skip: set[str] = set()  # keys the broker already holds (read back on start)
        # The mark the read-back started from, and the head then: the skipped messages were
        # stored after that mark, so it is the one saved until the cursor passed them all.
        self.floor: tuple[BrokerMark, int] | None = None
        self.saved: tuple[int, Any] | None = None
        self.mark: BrokerMark | None = None  # the saved cursor's broker mark, as loaded
        self.loaded = False  # the saved cursor is read back: only then may it be written

    def settle(self, seq: int) -> None:
        self.settled.add(seq)
        out = self.outstanding
        while out and out[0] in self.settled:
            self.settled.discard(out.popleft())

    def cursor(self) -> int:
        return self.outstanding[0] - 1 if self.outstanding else self.fetched

    def note_dispatch(self, mark: BrokerMark, max_seq: int) -> None:
        """Remember the broker's position before a batch went out, compactly: only entries of
        growing ``max_seq`` matter, and merging keeps the earlier (safer) mark.
        """
        marks = self.marks
        if marks and max_seq <= marks[-1][1]:
            return
        if len(marks) >= MAX_MARKS:
            marks[-1] = (marks[-1][0], max_seq)
        else:
            marks.append((mark, max_seq))

    def state(self, broker_now: Callable[[], BrokerMark]) -> tuple[int, dict[str, Any]]:
        """The cursor and the broker mark from before anything after it was sent (in this
        session or, for the messages the read-back skipped, in an earlier one); with nothing
        in flight, where the broker is now."""
        cursor = self.cursor()
        if self.floor is not None:
            if cursor < self.floor[1]:
                return cursor, {"mark": self.floor[0]}
            self.floor = None
        while self.marks and self.marks[0][1] <= cursor:
            self.marks.popleft()
        mark = self.marks[0][0] if self.marks else broker_now()
        return cursor, {"mark": mark}
