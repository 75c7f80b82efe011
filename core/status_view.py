"""``weir status`` on the screen: the readings of the store (core/status.py, core/store/status.py)
drawn as tables with ``rich``. On a terminal the tables are boxed and coloured, and ``--watch``
redraws them in place; anywhere else (a pipe, CI, systemd) each section is one plain table, no
colour nor box-drawing, a line a row, for ``grep`` and ``awk``.
"""

from __future__ import annotations

import io
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from core import status
from core.config.model import WeirConfig
from core.ids import lsn_to_str
from core.store import Store
from core.store import status as stored
from core.store.connectors import with_api_connectors
from core.store.consumers import CONSUMER_PREFIX, consumer_key

IDLE = stored.WorkState("not running", "", None)
STATE_STYLES = {"streaming": "green", "failed": "bold red", "not running": "dim"}
NOTE_WIDTH = 30  # the least a NOTE column wraps to (else the notes go below the table)
PLAIN_WIDTH = 100_000  # wide enough that no row of a plain table is ever folded

Row = Sequence[str | Text]


@dataclass(frozen=True)
class Reading:
    """One reading of the store; the rates are the cursors' moves over ``seconds``."""

    at: datetime
    seconds: float
    sources: list[status.SourceStatus]
    cursors: list[stored.CursorStatus]  # every connector (shard) of the file, and consumers'
    moved: dict[tuple[str, str], int]  # by (cursor, source), since the reading before
    configured: set[str]  # connector (shard) keys of the file
    queues: dict[str, tuple[int, int]]
    backfills: list[stored.BackfillStatus]
    works: stored.Works


def readings(
    cfg: WeirConfig, store: Store, interval: float, stop: threading.Event | None = None
) -> Iterator[Reading]:
    """A reading every ``interval`` seconds, each with the rates since the one before (the
    first: since the cursors were read ``interval`` seconds before it), until ``stop``."""
    stop = stop or threading.Event()
    before = {(c.name, c.source): c.seq for c in stored.cursors(store)}
    then = time.monotonic()
    while True:
        if stop.wait(max(interval - (time.monotonic() - then), 0.0)):
            return
        sources = status.sources(cfg, store)
        cursors = stored.cursors(store)
        now = time.monotonic()
        queues = stored.consumer_queues(store)
        # Every connector (shard) of the file, also one that never got as far as its cursor.
        shown = {c.name for c in cursors} | {consumer_key(q) for q in queues}
        configured = {shard.key(c.name): c for c, shard in cfg.connector_shards()}
        cursors += [stored.CursorStatus(key, "-", c.stream, 0, 0, 0.0, 0, None)
                    for key, c in configured.items() if key not in shown]  # fmt: skip
        moved = {(c.name, c.source): c.seq - before.get((c.name, c.source), c.seq)
                 for c in cursors}  # fmt: skip
        fills, works = stored.backfills(store), stored.works(store)
        yield Reading(datetime.now(), max(now - then, 1e-9), sources, cursors, moved,
                      set(configured), queues, fills, works)  # fmt: skip
        before, then = {(c.name, c.source): c.seq for c in cursors}, now


def sections(r: Reading, width: int | None) -> list[RenderableType]:
    """The tables of a reading: sources, connectors, consumers and backfills (those two when
    there are any), for a terminal ``width`` columns wide, or plain when None.

    A connector's (and a consumer's feed's) BEHIND is the messages stored that its cursor has
    not passed yet (not yet sent, failed, or skipped by its filters; a consumer's: not yet in
    its queue), BEHIND BY how long ago the oldest of them was stored. A consumer's QUEUED is
    the messages in its queue waiting to be received (never delivered, or nacked), UNACKED
    those received and neither acked nor nacked (docs/operations.md “Monitoring”)."""
    out = [_sources(r, width), _connectors(r, width)]
    if r.queues:
        out.append(_table(width, "Consumers", ["CONSUMER", "#QUEUED", "#UNACKED"],
                          [(n, str(p), str(a)) for n, (p, a) in r.queues.items()]))  # fmt: skip
    if r.backfills:
        out.append(_backfills(r, width))
    return out


def _sources(r: Reading, width: int | None) -> RenderableType:
    rows = []
    for s in r.sources:
        lag = "-" if s.slot_bytes is None else _bytes(s.slot_bytes)
        lsn = lsn_to_str(s.commit_lsn) if s.kind == "postgres" else str(s.commit_lsn)
        w = r.works.get(f"source:{s.name}", IDLE) if s.kind == "postgres" else None
        slot_note = "" if s.slot_active in (None, True) else "slot not being read"
        failed = f"{s.failed} changes on weir.source_failures" if s.failed else ""
        note = (w.detail if w else "") or s.error or failed or slot_note
        rows.append((s.name, s.kind, _state(w.state if w else "-"), str(s.events_seq),
                     str(s.records_seq), lsn, lag, s.owner or "-", note))  # fmt: skip
    return _table(width, "Sources", ["SOURCE", "KIND", "STATE", "#EVENTS SEQ",
                  "#RECORDS SEQ", "LAST LSN", "#SLOT LAG", "OWNER", "NOTE"], rows)  # fmt: skip


def _connectors(r: Reading, width: int | None) -> RenderableType:
    rows = []
    for c in r.cursors:
        rate = f"{max(r.moved[(c.name, c.source)], 0) / r.seconds:.0f}"
        consumer = c.name.startswith(CONSUMER_PREFIX)
        w = r.works.connector(c.name) if not consumer else None
        w = w or (IDLE if c.name in r.configured else None)
        failed = Text(str(c.failed), "red" if c.failed else "")
        rows.append((c.name, _state(w.state if w else "-"), c.source, c.stream,
                     str(c.lag_messages), f"{c.lag_seconds:.1f}s", rate, failed, c.owner or "-",
                     w.detail if w else ""))  # fmt: skip
    return _table(width, "Connectors", ["CONNECTOR", "STATE", "SOURCE", "STREAM", "#BEHIND",
                  "#BEHIND BY", "#RATE/S", "#FAILED", "OWNER", "NOTE"], rows)  # fmt: skip


def _backfills(r: Reading, width: int | None) -> RenderableType:
    rows = []
    for b in r.backfills:
        done = f"{min(b.rows_read * 100 // b.rows_total, 99)}%" if b.rows_total else "-"
        state = "finished" if b.finished else f"last page {b.idle_seconds:.0f}s ago"
        if b.requested is not None:  # capture asked for it (again): not started yet
            state, done = f"waiting: {b.requested}", "-"
        rows.append((b.table, b.source, f"{b.rows_read:,}", f"{b.rows_total:,}",
                     "100%" if b.finished and not b.requested else done,
                     f"{b.rows_written:,}", state))  # fmt: skip
    return _table(width, "Backfills", ["BACKFILL", "SOURCE", "#READ", "#OF", "#DONE",
                  "#WRITTEN", "STATE"], rows)  # fmt: skip


def _table(
    width: int | None, title: str, headers: list[str], rows: Sequence[Row]
) -> RenderableType:
    """A section. Headers starting with ``#`` are numbers: right-aligned on a terminal (plain
    tables keep every column left-aligned, so that a column starts where its header does).
    On a terminal too narrow for the table the words wrap (the widest first); when a NOTE
    column would be left less than ``NOTE_WIDTH``, the notes go below the table instead."""
    if width is None:
        table = Table(box=None, pad_edge=False, header_style="")
    elif headers[-1] == "NOTE" and _needed(headers[:-1], rows) + NOTE_WIDTH > width:
        notes = [Text.assemble((str(row[0]), "bold"), ": ", row[-1]) for row in rows if row[-1]]
        return Group(_table(width, title, headers[:-1], [row[:-1] for row in rows]), *notes)
    else:
        table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
                      header_style="bold cyan", collapse_padding=True)  # fmt: skip
    for h in headers:  # a narrow terminal folds the words, never the numbers
        number = h.startswith("#")
        table.add_column(h.lstrip("#"), no_wrap=number, overflow="fold",
                         justify="right" if width and number else "left")  # fmt: skip
    for row in rows:  # Text: an error's "[...]" is not rich markup
        table.add_row(*(v if isinstance(v, Text) else Text(v) for v in row))
    return table


def _needed(headers: list[str], rows: Sequence[Row]) -> int:
    """Columns a boxed table of these (unwrapped) needs."""
    cells = [[h.lstrip("#"), *(str(row[i]) for row in rows)] for i, h in enumerate(headers)]
    return sum(max(map(len, column)) + 2 for column in cells) + 2


def _state(state: str) -> Text:
    return Text(state, STATE_STYLES.get(state, "yellow" if state != "-" else ""))


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _heading(r: Reading) -> Text:
    return Text(f"weir status at {r.at:%H:%M:%S}, rates over {r.seconds:.1f}s", "bold")


def plain(renderables: Sequence[RenderableType]) -> str:
    """Renderables as plain text, a blank line between them: no colour, no cursor moves, no
    line folded, no trailing blanks."""
    out = io.StringIO()
    console = Console(file=out, width=PLAIN_WIDTH, color_system=None, force_terminal=False,
                      highlight=False)  # fmt: skip
    for i, r in enumerate(renderables):
        if i:
            console.print()
        console.print(r)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


def show(cfg: WeirConfig, store: Store, interval: float, watch: bool) -> int:
    """``weir status``: one reading, or with ``watch`` one every ``interval`` until ^C (exit 0);
    redrawn in place on a terminal, printed one after the other elsewhere."""
    cfg = with_api_connectors(cfg, store)  # the connectors made over the API too
    console = Console(highlight=False)
    width = console.width if console.is_terminal else None
    if not watch:
        tables = sections(next(readings(cfg, store, interval)), width)
        if width:
            console.print(Group(*tables))
        else:
            sys.stdout.write(plain(tables))
        return 0
    # ^C ends the watch between readings: an interrupt in the middle of a query would wait
    # for the server to cancel it (seen to take over 30 s on a loaded machine).
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if width:
        with Live(console=console, auto_refresh=False) as live:
            for r in readings(cfg, store, interval, stop):
                live.update(Group(_heading(r), *sections(r, console.width)), refresh=True)
    else:
        for r in readings(cfg, store, interval, stop):
            sys.stdout.write(plain([_heading(r), *sections(r, None)]) + "\n")
            sys.stdout.flush()
    return 0
