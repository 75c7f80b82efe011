"""The replication slot held against the store's checkpoint, on every start and reconnect.

A slot that was dropped, invalidated (its WAL removed) or moved on by another program has lost
the changes between the store's checkpoint and where the slot now starts. Capture never carries
on as if nothing happened (docs/design.md “Guarantees”): it stops with an error naming the gap, or,
when the source says ``on_slot_loss: backfill``, goes on from the slot (made anew if it is
gone) and backfills every table.

The rule that makes this exact: the slot's confirmed position never passes the store's
``end_lsn``, because capture writes a position to the store before it confirms it to Postgres.
So a slot found beyond ``end_lsn`` was moved by something else.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from core.ids import lsn_to_str
from core.redact import said
from core.sources.pg.errors import SourceSetupError
from core.sources.pg.setup import ensure_slot

if TYPE_CHECKING:
    from core.config.sources import PostgresSource
    from core.store.writer import Checkpoint

log = logging.getLogger("weir.source")

SLOT_SQL = """
SELECT (confirmed_flush_lsn - '0/0')::bigint, wal_status = 'lost'
FROM pg_replication_slots WHERE slot_name = %s
"""


class SlotGapError(SourceSetupError):
    """Changes were lost with the replication slot; the message names the gap and the fix."""


@dataclass(frozen=True)
class SlotStart:
    """Where capture starts, and what the store must be told first."""

    lsn: int  # the slot's position (or the checkpoint's, when it is further)
    gap: str | None = None  # the lost changes, when the slot was re-created to go on


@contextmanager
def slot_lock(conn: psycopg.Connection[Any], src: PostgresSource) -> Iterator[None]:
    """Who makes a source's slot and notes it as the store's (or checks it is), one at a time,
    by an advisory lock on the source: capture's first start and a backfill's raced, and one
    took the other's new slot for another program's and stopped (found by an outside tryout)."""
    key = f"weir:slot:{src.slot}"
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def check_slot(conn: psycopg.Connection[Any], src: PostgresSource, cp: Checkpoint) -> SlotStart:
    """Hold the slot against the checkpoint; create it on the first start.

    Raises :class:`SlotGapError` when changes were lost, unless ``on_slot_loss: backfill``:
    then capture goes on from the slot (made anew if gone), and the gap is returned, for the
    caller to backfill.
    """
    if not cp.tracked:  # the first start (or the first since Weir kept this rule): adopt it
        if not ensure_slot(conn, src) and cp.slot != src.slot and cp.end_lsn == 0:
            raise SourceSetupError(
                said(
                    "source %r: replication slot %r exists, and this store did not "
                    "make it: another Weir store (or another program) reads it, and "
                    "a slot read by two loses changes for both. Give this source a "
                    "slot of its own (slot: in its config), or, if no other store "
                    "uses that one (a stopped Weir neither), drop it: SELECT "
                    "pg_drop_replication_slot('%s')",
                    src.name,
                    src.slot,
                    src.slot,
                )
            )
        return SlotStart(max(cp.end_lsn, _position(conn, src)[0] or 0))
    confirmed, lost = _position(conn, src)
    if confirmed is not None or lost:
        ensure_slot(conn, src)  # refuses a slot of another plugin or database, or a busy one
    if confirmed is not None and not lost and confirmed <= cp.end_lsn:
        return SlotStart(cp.end_lsn)
    if cp.slot is not None and cp.slot != src.slot:
        what = said(
            "the source's slot is now %r, but the store was captured through "
            "%r (if it still exists it holds WAL until dropped: SELECT "
            "pg_drop_replication_slot('%s'))",
            src.slot,
            cp.slot,
            cp.slot,
        )
    elif confirmed is None:
        what = said("replication slot %r does not exist (it was dropped)", src.slot)
    elif lost:
        what = said("replication slot %r was invalidated (the WAL it needed was removed)", src.slot)
    else:
        what = said(
            "replication slot %r starts at %s (it was re-created, or read by another program)",
            src.slot,
            lsn_to_str(confirmed),
        )
    since = (
        said(", captured %s", format(cp.at, "%Y-%m-%d %H:%M:%S %Z")) if cp.at is not None else ""
    )
    gap = said(
        "%s: changes committed after %s%s were not captured", what, lsn_to_str(cp.end_lsn), since
    )
    if src.on_slot_loss == "stop":
        raise SlotGapError(
            said(
                "source %r: %s. Weir stops rather than go on without them: set "
                "on_slot_loss: backfill on the source to make the slot anew and "
                "backfill every table into the records stream (the gap's events "
                "cannot be recovered)",
                src.name,
                gap,
            )
        )
    if lost:  # a slot that was re-created keeps what it has seen since: only a lost one goes
        conn.execute("SELECT pg_drop_replication_slot(%s)", (src.slot,))
    ensure_slot(conn, src)
    start = _position(conn, src)[0] or 0
    log.warning("source %s: %s; going on from %s and backfilling every table",
                src.name, gap, lsn_to_str(start))  # fmt: skip
    return SlotStart(start, gap)


def _position(conn: psycopg.Connection[Any], src: PostgresSource) -> tuple[int | None, bool]:
    """(the slot's confirmed position, whether it was invalidated); (None, False) if none."""
    row = conn.execute(SLOT_SQL, (src.slot,)).fetchone()
    if row is None:
        return None, False
    return (None if row[0] is None else int(row[0])), bool(row[1])


# pgoutput reads the publication as it was at each change: one dropped and made anew, or a new
# name in the config, is missing at the slot's position for ever.
_PUBLICATION_GONE = re.compile(r'publication "[^"]*" does not exist')


def unreadable(conn: psycopg.Connection[Any], src: PostgresSource, error: str) -> bool:
    """When ``error`` (the replication stream's) says the slot can never be read past where it
    is: raise :class:`SlotGapError`, or with ``on_slot_loss: backfill`` drop the slot, so
    that the next session makes it anew and backfills (``check_slot``), and return True."""
    if not _PUBLICATION_GONE.search(error):
        return False
    gap = said(
        "replication slot %r cannot be read past a change made while "
        "publication %r did not exist (it was dropped and made anew, or "
        "the config names another one)",
        src.slot,
        src.publication,
    )
    if src.on_slot_loss == "stop":
        raise SlotGapError(
            said(
                "source %r: %s: set on_slot_loss: backfill on the source to make "
                "the slot anew and backfill every table (the events since cannot "
                "be recovered)",
                src.name,
                gap,
            )
        )
    conn.execute("SELECT pg_drop_replication_slot(%s)", (src.slot,))
    log.warning("source %s: %s; dropped the slot, to make it anew and backfill", src.name, gap)
    return True
