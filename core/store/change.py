"""A change as every producer of a source hands it to the store (capture, HTTP ingest), and
what the store cannot hold of one."""

from __future__ import annotations

from typing import Any, NamedTuple

from core.envelope import dumps
from core.ids import lsn_to_str
from core.redact import Said, first_line, said


class Change(NamedTuple):
    """One change to one record, in the order it was committed upstream.

    ``record`` holds new values (old ones for a delete); ``missing`` names the table's other
    columns, whose values the WAL left out (unchanged TOAST, a delete carrying only the key);
    ``old_missing`` those whose old value it left out while sending a new one (an old row's
    unchanged TOAST value). The store takes them from the record's version before
    (``core.store.records.Previous``), and only theirs, so a dropped column leaves the record
    at its next version; ``held_as`` pairs a column of ``missing`` with the other names that
    version may hold it under (renames capture saw), and is None when that version's names cannot be
    trusted (core/sources/pg/columns.py): nothing is taken from it. ``old_record_id`` is set
    when an update changed the key.
    ``version``/``idx`` order versions of a record: commit LSN (or producer version) and position.
    ``event_lsn`` is the events stream's commit LSN when it is not ``version`` (HTTP ingest:
    the batch number, so that event idempotency keys stay unique).
    """

    action: str  # insert | update | delete | truncate
    collection_id: str
    record_id: str | None
    record: dict[str, Any] | None
    changes: dict[str, Any] | None
    missing: tuple[str, ...]
    old_record_id: str | None
    version: int
    idx: int
    committed_at: str  # ISO-8601
    event_lsn: int | None = None
    old_missing: tuple[str, ...] = ()
    held_as: tuple[tuple[str, tuple[str, ...]], ...] | None = ()


REFUSED = ("22", "54", "XX")  # error classes of a store write: data, program limit, internal
MAX_JSON = 255 << 20  # bytes of one record's JSON: a batch (a bytea) holds at most 1 GiB


class UnstorableChange(RuntimeError):
    """A change the store refuses; the message names it and the fix. Capture stops on it, or
    (``on_unstorable: fail``) puts it on the source's failed list with its ``reason``."""

    FIX = (
        "set on_unstorable: fail on the source to put such a change on its failed list and go "
        "on (the change is in the WAL as it is; a column list made now does not apply to it)"
    )

    def __init__(self, reason: str) -> None:
        super().__init__(said("%s; %s", reason, Said(self.FIX)))
        self.reason = reason

    @classmethod
    def too_large(cls, ch: Change, size: int) -> UnstorableChange:
        record = ch.record or {}
        column = max(record, key=lambda k: len(dumps(record[k])), default="?")
        return cls(
            said(
                "cannot store the %s of %s record %s committed at %s: its JSON "
                "is %s bytes, above the store's limit of %s (largest column: %r)",
                ch.action,
                ch.collection_id,
                ch.record_id,
                lsn_to_str(ch.version),
                format(size, ","),
                format(MAX_JSON, ","),
                column,
            )
        )

    @classmethod
    def refused(cls, ch: Change, error: Exception) -> UnstorableChange:
        """The store refused to write ``ch`` (a data error, a limit): what it said."""
        return cls(
            said(
                "the store refused the %s of %s record %s committed at %s: %s",
                ch.action,
                ch.collection_id,
                ch.record_id,
                lsn_to_str(ch.version),
                first_line(error),
            )
        )
