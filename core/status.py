"""Where sources stand: the store's view of them (core/store/status.py, which also has the
connectors', consumers' and backfills') with what only the source databases know, their
replication slots. ``weir status`` prints it, ``/metrics`` exports it and the slot-lag check
warns from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.failures import postgres_unreachable
from core.redact import first_line
from core.sources.pg.encoding import UnreadableDatabase, connect
from core.store import Store
from core.store import status as stored

log = logging.getLogger("weir.status")


@dataclass(frozen=True)
class SourceStatus:
    name: str
    kind: str
    events_seq: int
    records_seq: int
    commit_lsn: int  # last captured commit (postgres) or ingest batch (http)
    slot_bytes: int | None  # WAL the slot holds back; None: not a postgres source or unreachable
    slot_active: bool | None
    error: str | None
    owner: str | None  # the instance capturing it (core/runtime/leases.py), None when none is
    failed: int  # changes the store could not hold (on_unstorable: fail)


def sources(cfg: WeirConfig, store: Store) -> list[SourceStatus]:
    """Every source of the store, with its slot's lag when it is a postgres source."""
    out = []
    declared = {s.name: s for s in cfg.sources}
    for s in stored.sources(store):
        src = declared.get(s.name)
        slot: tuple[int | None, bool | None, str | None] = (None, None, None)
        if isinstance(src, PostgresSource):
            slot = slot_lag(src)
        out.append(SourceStatus(s.name, s.kind, s.events_seq, s.records_seq, s.commit_lsn,
                                *slot, s.owner, s.failed))  # fmt: skip
    return out


def slot_lag(src: PostgresSource) -> tuple[int | None, bool | None, str | None]:
    """(bytes of WAL the slot holds back, whether it is in use, why unknown), asked of the
    source's own server."""
    try:
        with connect(
            src.url.get_secret_value(), autocommit=True, connect_timeout=5,
            application_name="weir:status",
        ) as conn:  # fmt: skip
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (src.slot,),
            ).fetchone()
    except psycopg.OperationalError as e:  # why, as a command says it (never a secret)
        return None, None, str(postgres_unreachable(e, src.url.get_secret_value(), "it"))
    except (psycopg.Error, UnreadableDatabase) as e:
        return None, None, f"cannot read its slot: {first_line(e)}"
    if row is None:
        return None, None, f"replication slot {src.slot} does not exist"
    return (None if row[0] is None else int(row[0])), bool(row[1]), None
