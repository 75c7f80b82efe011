"""Checks a source database before capture, and creates its publication and slot when missing.

Every problem a user can fix is a :class:`SourceSetupError` with one line saying what to do.
Weir never makes the user's own writes fail: a table whose updates or deletes could not be
published (no primary key and no replica identity) is never added to the publication, and a
source that follows ``schemas:`` reports such a table instead of stopping.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from core.redact import Said, remember_names, said
from core.sources.pg.errors import SlotBusyError, SourceSetupError
from core.sources.pg.follow import BACKFILL_PREFIX, follow_tables
from core.sources.pg.grants import role_of, say_unreadable
from core.sources.pg.tables import (
    ALL_TABLES_SQL,
    TABLE_INFO_SQL,
    readable_tables,
    table_problem,
    tables_of,
    tables_wanted,
)
from core.tables import closest, parse_table, table_name

if TYPE_CHECKING:  # for annotations only: a seed task does not import the config models
    from core.config.sources import PostgresSource


log = logging.getLogger("weir.source")


def capturable_tables(
    conn: psycopg.Connection[Any], src: PostgresSource, say: bool = True
) -> list[tuple[str, str]]:
    """The source's tables that can be captured. A table named in ``tables:`` that cannot is
    an error; one of ``schemas:`` is left out, and reported when ``say`` (capture's start
    says it; a backfill's list of the same tables does not say it again). Their names, those
    of the schemas it follows too, are names as the config's are: log lines print them as they
    are (core/logs.py)."""
    listed = {parse_table(t) for t in src.tables}
    published = (
        published_tables(conn, src.publication) if say and not src.create_publication else set()
    )
    tables = []
    found = tables_of(conn, src)
    remember_names(table_name(schema, table) for schema, table in found)
    for schema, table in found:
        name = table_name(schema, table)
        problem = table_problem(src, name, conn.execute(TABLE_INFO_SQL, (schema, table)).fetchone())
        if problem is None:
            tables.append((schema, table))
        elif (schema, table) in listed:
            near = closest(name, _all_tables(conn)) if "does not exist" in problem else ""
            raise SourceSetupError(said("source %r: %s%s", src.name, problem, near))
        elif say and (schema, table) in published:  # Weir cannot leave it out: the DBA's
            log.warning("source %s: %s; it is in publication %s, which Weir does not manage, so "
                        "its changes reach capture, which cannot store them: each stops capture "
                        "(on_unstorable: stop) or goes to the source's failed list (fail), "
                        "unless it is taken out: ALTER PUBLICATION %s DROP TABLE %s", src.name,
                        problem, src.publication, src.publication, name)  # fmt: skip
        elif say:
            log.warning("source %s: not capturing: %s", src.name, problem)
    return tables


def _all_tables(conn: psycopg.Connection[Any]) -> list[str]:
    """The database's tables (not the system's) a UTF-8 client can name, as ``schema.table``."""
    return [table_name(*names) for names in readable_tables(conn, ALL_TABLES_SQL)[0]]


def prepare(
    conn: psycopg.Connection[Any], src: PostgresSource, say: bool = True
) -> list[tuple[str, str]]:
    """Check the server and the tables, and create or complete the publication (the slot is
    ``ensure_slot``'s). A table added to an existing publication is backfilled
    (``_ensure_publication``). Returns the tables left out of a publication Weir does not
    manage (``create_publication: false``), to backfill once a DBA adds them.

    ``conn`` is an ordinary autocommit connection to the source database. Tables named in
    ``tables:`` must be capturable; tables of ``schemas:`` that are not are left out, and with
    the tables the role cannot read reported when ``say``: by capture's start and a seed, not
    again by each backfill.
    """
    wal_level = conn.execute("SHOW wal_level").fetchone()
    if not wal_level or wal_level[0] != "logical":
        level = wal_level[0] if wal_level else "?"
        raise SourceSetupError(
            said(
                "source %r: wal_level is %r but capture needs 'logical': run "
                "ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL",
                src.name,
                level,
            )
        )
    _replication_room(conn, src)
    return complete_publication(conn, src, follow=True, say=say)


def _replication_room(conn: psycopg.Connection[Any], src: PostgresSource) -> None:
    """The server lets a replication connection in and has a slot for the source: what only a
    DBA can change (a restart for either setting) is said now, with the fix, not retried."""
    row: Any = conn.execute(
        "SELECT current_setting('max_wal_senders')::int,"
        " current_setting('max_replication_slots')::int,"
        " (SELECT count(*) FROM pg_replication_slots),"
        " EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)", (src.slot,)
    ).fetchone()  # fmt: skip
    senders, slots, used, ours = row
    if senders == 0:
        raise SourceSetupError(said(
            "source %r: max_wal_senders is 0, so the server lets no replication connection in: "
            "run ALTER SYSTEM SET max_wal_senders = 10; and restart PostgreSQL",
            src.name))  # fmt: skip
    if slots == 0:
        raise SourceSetupError(said(
            "source %r: max_replication_slots is 0, so the server keeps no slot for capture: "
            "run ALTER SYSTEM SET max_replication_slots = 10; and restart PostgreSQL",
            src.name))  # fmt: skip
    if not ours and used >= slots:
        raise SourceSetupError(said(
            "source %r: all %d replication slots are in use and none is %s: drop one no longer "
            "used (SELECT slot_name, active FROM pg_replication_slots; then SELECT "
            "pg_drop_replication_slot('NAME')), or raise max_replication_slots and restart "
            "PostgreSQL", src.name, slots, src.slot))  # fmt: skip


def complete_publication(
    conn: psycopg.Connection[Any], src: PostgresSource, *, follow: bool = False, say: bool = False
) -> list[tuple[str, str]]:
    """Add the source's capturable tables missing from its publication (each backfilled), and
    (``follow``) install the event trigger; one caller at a time per publication (capture, a
    backfill and a seed may all start at once; the lock is the publication's, in the source
    database, whichever store's source it is: not a store's, core/store/shared.py). Returns the
    tables missing from a publication Weir does not manage."""
    lock = ("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
            "SELECT pg_advisory_unlock(hashtextextended(%s, 0))")  # fmt: skip
    key = f"weir:prepare:{src.publication}"
    conn.execute(lock[0], (key,))
    try:
        tables = capturable_tables(conn, src, say)
        waiting = _ensure_publication(conn, src, tables)
        if say:  # those a backfill of backfill: reads are said by it, as it stops weir run
            say_unreadable(conn, src, [t for t in tables if not src.backfills(table_name(*t))])
        if follow and src.create_publication:
            follow_tables(conn, src)
        elif follow and say:
            log.info("source %s: publication %s is not Weir's (create_publication: false): "
                     "tables created, dropped or made anew while Weir runs are not followed; "
                     "one the config names is backfilled once it is added to the publication",
                     src.name, src.publication)  # fmt: skip
        return waiting
    finally:
        conn.execute(lock[1], (key,))


def published_tables(conn: psycopg.Connection[Any], publication: str) -> set[tuple[str, str]]:
    """The (schema, table)s whose rows ``publication`` publishes now."""
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
        (publication,),
    ).fetchall()
    return {(str(s), str(t)) for s, t in rows}


def _via_root(conn: psycopg.Connection[Any], src: PostgresSource) -> bool | None:
    """Whether the source's publication publishes partitions under their tables; None when
    it does not exist."""
    row = conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (src.publication,)
    ).fetchone()
    return None if row is None else bool(row[0])


def left_out(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], Said | None]:
    """Of ``tables``, those the publication Weir does not manage (``create_publication:
    false``) leaves out, and the line that says so with the fix; SourceSetupError when it
    does not exist."""
    if _via_root(conn, src) is None:
        raise SourceSetupError(
            said(
                "source %r: publication %r does not exist and create_publication "
                "is false: CREATE PUBLICATION it, or let Weir create it",
                src.name,
                src.publication,
            )
        )
    published = published_tables(conn, src.publication)
    missing = [t for t in tables if t not in published]
    if not missing:
        return [], None
    names = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in missing).as_string(conn)
    return missing, said(
        "source %s: not capturing %s: not in publication %s, which Weir does not manage "
        "(create_publication: false): ALTER PUBLICATION %s ADD TABLE %s (Weir backfills it then)",
        src.name, Said(", ".join(table_name(s, t) for s, t in missing)), src.publication,
        Said(sql.Identifier(src.publication).as_string(conn)), Said(names))  # fmt: skip


def _listed(conn: psycopg.Connection[Any], tables: list[tuple[str, str]]) -> sql.Composable:
    """``tables`` as a publication lists them: ONLY a table's own rows (its inheritance
    children are tables of their own; a partitioned table's partitions are not, and ONLY does
    not apply to it)."""
    kinds = {
        (r[0], r[1]): r[2]
        for r in conn.execute(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([s for s, _ in tables], [t for _, t in tables]),
        ).fetchall()
    }
    return sql.SQL(", ").join(
        sql.SQL("ONLY {}" if kinds.get((s, t)) == "r" else "{}").format(sql.Identifier(s, t))
        for s, t in tables
    )


def _create(src: PostgresSource, listed: sql.Composable | None) -> sql.Composed:
    """The publication's CREATE: a partitioned table is one collection, its partitions' rows
    published under it."""
    return sql.SQL("CREATE PUBLICATION {}{} WITH (publish_via_partition_root = true)").format(
        sql.Identifier(src.publication),
        sql.SQL(" FOR TABLE {}").format(listed) if listed is not None else sql.SQL(""),
    )


def publication_problem(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> Said | None:
    """Why Weir cannot make the source's publication of ``tables`` (``create_publication``,
    and none yet): what its role lacks, with the fix; None when it can, or one exists."""
    return None if _via_root(conn, src) is not None else _may_not_create(conn, src, tables)


def _may_not_create(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> Said | None:
    """What the role lacks to create the publication of ``tables``, with the fix; or None."""
    row = conn.execute(
        "SELECT has_database_privilege(current_database(), 'CREATE'), (SELECT ARRAY[n.nspname,"
        " c.relname] FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE"
        " (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[])) AND NOT"
        " pg_has_role(c.relowner, 'USAGE') ORDER BY 1 LIMIT 1)",
        ([s for s, _ in tables], [t for _, t in tables]),
    ).fetchone()
    assert row is not None
    may_create, not_owned = row
    if may_create and not_owned is None:
        return None
    me, made = role_of(conn), _create(src, _listed(conn, tables) if tables else None)
    if not_owned is None:  # it owns the tables: CREATE on the database is missing
        db = sql.Identifier(conn.info.dbname).as_string(conn)
        why = said("permission denied for database %s", conn.info.dbname)
        fix = said("as the database's owner run GRANT CREATE ON DATABASE %s TO %s; or have it "
                   "made (%s) and set create_publication: false", Said(db), me,
                   Said(made.as_string(conn)))  # fmt: skip
    else:
        why = said("must be owner of table %s", Said(table_name(*not_owned)))
        fix = said("as the tables' owner run %s; and set create_publication: false (or make "
                   "the role own the tables, with CREATE on the database)",
                   Said(made.as_string(conn)))  # fmt: skip
    return said("source %r: role %s cannot create publication %s (%s): %s",
                src.name, me, src.publication, why, fix)  # fmt: skip


def _ensure_publication(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    if not src.create_publication:  # the DBA's: only looked at
        missing, says = left_out(conn, src, tables)
        if says is not None:
            log.warning("%s", says)
        return missing
    pub = sql.Identifier(src.publication)
    via_root = _via_root(conn, src)
    published = published_tables(conn, src.publication)
    missing = [t for t in tables if t not in published]
    _leave(conn, src)
    idents = _listed(conn, missing) if missing else None
    if via_root is None:
        if (why := _may_not_create(conn, src, missing)) is not None:
            raise SourceSetupError(why)
        conn.execute(_create(src, idents))
        log.info("source %s: created publication %s", src.name, src.publication)
        return []
    if not via_root:
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} SET (publish_via_partition_root = true)").format(pub)
        )
        log.info("source %s: publication %s now publishes partitions under their tables",
                 src.name, src.publication)  # fmt: skip
    if idents is not None:
        # A table joining a publication that capture reads already may hold rows nothing
        # captured: the message, read in order by capture, asks for its backfill.
        with conn.transaction():
            conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, idents))
            for schema, table in missing:
                conn.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                             (BACKFILL_PREFIX, json.dumps([schema, table])))  # fmt: skip
        log.info(
            "source %s: added %s to publication %s",
            src.name,
            ", ".join(table_name(s, t) for s, t in missing),
            src.publication,
        )
    return []


def _leave(conn: psycopg.Connection[Any], src: PostgresSource) -> None:
    """Take out of the publication the source's tables that cannot be captured (one that lost
    its key while Weir was down, say): Postgres would refuse their updates and deletes. Each
    is looked at now: one the follow trigger has just added (created a moment ago) stays."""
    in_scope = tables_wanted(src, None)
    members = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_publication_rel r"
        " JOIN pg_publication p ON p.oid = r.prpubid JOIN pg_class c ON c.oid = r.prrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
        (src.publication,),
    ).fetchall()
    leaving = [
        (s, t) for s, t in members if in_scope(s, t) and table_problem(
            src, table_name(s, t), conn.execute(TABLE_INFO_SQL, (s, t)).fetchone()) is not None
    ]  # fmt: skip
    if leaving:
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
            sql.Identifier(src.publication),
            sql.SQL(", ").join(sql.Identifier(s, t) for s, t in leaving)))  # fmt: skip
        log.info("source %s: took %s out of publication %s", src.name,
                 ", ".join(table_name(s, t) for s, t in leaving), src.publication)  # fmt: skip


def slot_problem(conn: psycopg.Connection[Any], src: PostgresSource) -> Said | None:
    """Why capture cannot use the source's replication slot: one its role may not create (no
    REPLICATION), one of another plugin or database; None when it can."""
    row = conn.execute(
        "SELECT plugin, database = current_database() FROM pg_replication_slots"
        " WHERE slot_name = %s",
        (src.slot,),
    ).fetchone()
    may = conn.execute("SELECT rolreplication OR rolsuper FROM pg_roles"
                       " WHERE rolname = current_user").fetchone()  # fmt: skip
    if may is None or not may[0]:  # to make a slot, and to read one
        me = role_of(conn)
        return said("source %r: role %s may not %s replication slot %s (it has no "
                    "REPLICATION): as a superuser, ALTER ROLE %s REPLICATION", src.name, me,
                    Said("create" if row is None else "read"), src.slot, me)  # fmt: skip
    if row is None:
        return None
    plugin, same_db = row
    if plugin == "pgoutput" and same_db:
        return None
    return said("source %r: replication slot %r exists but %s: give this source another slot "
                "name or drop that slot", src.name, src.slot,
                said("belongs to another database") if not same_db
                else said("uses plugin %r", plugin))  # fmt: skip


def ensure_slot(conn: psycopg.Connection[Any], src: PostgresSource) -> bool:
    """Create the replication slot when missing (returns True then); refuse a slot Weir cannot
    use."""
    if (why := slot_problem(conn, src)) is not None:
        raise SourceSetupError(why)
    row = conn.execute(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (src.slot,)
    ).fetchone()
    if row is None:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (src.slot,))
        log.info("source %s: created replication slot %s", src.name, src.slot)
        return True
    (active_pid,) = row
    if active_pid is not None:
        raise SlotBusyError(
            said(
                "source %r: replication slot %r is in use by another process "
                "(pid %s): stop the other consumer or use another slot name",
                src.name,
                src.slot,
                active_pid,
            )
        )
    return False
