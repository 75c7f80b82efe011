"""A publication Weir does not manage (``create_publication: false``), watched for tables a DBA
takes out of it: their changes are not published while they are out, so each is named in the
log and backfilled once it is back (core/sources/backfill.py waits for that)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg

from core.sources.pg.setup import published_tables

WATCH_EVERY = 1.0  # seconds between looks at the publication's tables


class PublicationWatch:
    """Which of the source's tables are in ``publication``, looked at once a ``WATCH_EVERY``."""

    def __init__(
        self,
        catalog: psycopg.Connection[Any],
        publication: str,
        wanted: Callable[[str, str], bool] | None,
    ) -> None:
        self.catalog, self.publication, self.wanted = catalog, publication, wanted
        self.tables = self._published()
        self.looked = time.monotonic()

    def left(self, now: float) -> list[tuple[str, str]]:
        """The tables (still there) taken out of the publication since the last look."""
        if now - self.looked < WATCH_EVERY:
            return []
        self.looked = now
        tables, before = self._published(), self.tables
        self.tables = tables
        gone = sorted(before - tables)
        if not gone:
            return []
        exists = self.catalog.execute(
            "SELECT s, t FROM unnest(%s::text[], %s::text[]) AS g(s, t) WHERE EXISTS ("
            " SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = g.s AND c.relname = g.t)",
            ([s for s, _ in gone], [t for _, t in gone]),
        ).fetchall()
        return [(str(s), str(t)) for s, t in exists]

    def _published(self) -> set[tuple[str, str]]:
        tables = published_tables(self.catalog, self.publication)
        return {(s, t) for s, t in tables if self.wanted is None or self.wanted(s, t)}
