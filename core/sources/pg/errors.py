"""The errors of a source database's setup, which capture, backfills and seeds share."""

from __future__ import annotations


class SourceSetupError(RuntimeError):
    """The source database is not ready for capture; retrying will not help."""


class SlotBusyError(RuntimeError):
    """The replication slot is used by another connection; this may pass (e.g. a restart)."""
