"""The event trigger that keeps a source's publication following its tables as the user's DDL
makes and drops them (docs/configuration.md “Source database”), and the logical messages it tells
capture by.

It adds a table created in a followed schema, or made anew under a listed name, to the
publication in the same transaction, so its first row is captured; a table that could not
publish its updates and deletes is left out, or taken out when it loses its key (so the user's
writes to it never fail), and no error of it ever reaches the user's statement. Messages, read
by capture in order: ``BACKFILL_PREFIX`` (a table joined with rows of its own),
``DROPPED_PREFIX`` (a captured table was dropped), ``MISSED_PREFIX`` (the publication could not
be changed for one: a lock timeout, say), ``LEFT_PREFIX`` (one left the publication),
``ALTERED_PREFIX`` (a published table was altered: renamed, or its columns changed),
``KEYLESS_PREFIX`` (a table was made that cannot be captured: no key, say), ``REWRITTEN_PREFIX``
(a table's values changed with no change of a row in the WAL: ``ALTER COLUMN … TYPE … USING``
rewrote its rows, or ``ALTER TYPE … RENAME VALUE`` renamed an enum label one of its columns
holds; its records are backfilled).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from core.store.migrations import STORE_DDL, STORE_MARK
from core.tables import parse_table

if TYPE_CHECKING:
    from core.config.sources import PostgresSource

log = logging.getLogger("weir.source")

BACKFILL_PREFIX = "weir:backfill"  # a logical message naming a table to backfill (and its oid)
DROPPED_PREFIX = "weir:dropped"  # one naming a table that was dropped
MISSED_PREFIX = "weir:missed"  # one naming a table that could not join, and why
LEFT_PREFIX = "weir:left"  # one naming a table that left the publication: it lost its key
ALTERED_PREFIX = "weir:altered"  # one naming a published table altered (renamed, say), by oid
KEYLESS_PREFIX = "weir:keyless"  # one naming a table made that cannot be captured (no key, say)
REWRITTEN_PREFIX = "weir:rewritten"  # one naming a table rewritten (ALTER TABLE … USING), by oid
TABLE_MESSAGES = (BACKFILL_PREFIX, DROPPED_PREFIX, MISSED_PREFIX, LEFT_PREFIX, ALTERED_PREFIX,
                  KEYLESS_PREFIX, REWRITTEN_PREFIX)  # fmt: skip
# The schema of the trigger's function, in the source database: named unlike a role, so that
# no role's "$user" in its search_path finds it (it was in "weir" before: OLD_HOME, cleared).
HOME, OLD_HOME = "weir_follow", "weir"

# The trigger's function (its parameters: see follow_tables; {q} is a dollar quote its body holds
# nowhere else). It skips the store's own DDL and tables (core/store/migrations.py). A table that
# may hold rows already (given a key later, or made by CREATE TABLE AS) is named in a
# BACKFILL_PREFIX message; one that can no longer publish its updates and deletes (its primary key
# or identity index dropped, say) leaves the publication, so the user's writes to it go on, with a
# LEFT_PREFIX message. The rule for a capturable table is core/sources/pg/tables.py:table_problem's.
# The commands whose end the function hears of (with sql_drop and table_rewrite).
_TAGS = "('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'ALTER TYPE')"
_FOLLOW_FUNCTION = """
CREATE OR REPLACE FUNCTION {fn}() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS {q}
DECLARE
    t record;
    pub oid;
    touched oid[];
    user_lock_timeout text := current_setting('lock_timeout');
    wait_ms int;
BEGIN
    IF current_setting({store_ddl}, true) = 'on' THEN
        RETURN;
    END IF;
    SELECT p.oid INTO pub FROM pg_publication p WHERE p.pubname = {pub};
    IF TG_EVENT = 'table_rewrite' THEN  -- its rows change, and the WAL has no change of theirs
        touched := ARRAY[coalesce(pg_partition_root(pg_event_trigger_table_rewrite_oid()),
                                  pg_event_trigger_table_rewrite_oid())];
    ELSIF TG_TAG IN ('ALTER TYPE', 'ALTER TABLE') THEN
        -- Rows whose text changes with no change in the WAL: those of a column of a type it
        -- altered (a composite's attributes, a table's row type; an enum's label renamed, not
        -- one added) or of a type made of it, and a partitioned table's (a partition attached
        -- or detached). Known by the objects it altered, not its text (a procedure's DDL, a
        -- script of many): every form is taken as one (a backfill more, never a value wrong),
        -- but an enum's, which only RENAME VALUE changes.
        touched := ARRAY(
            WITH RECURSIVE used(oid) AS (
                SELECT ty.oid FROM pg_event_trigger_ddl_commands() d JOIN pg_type ty
                ON (d.classid = 'pg_type'::regclass AND ty.oid = d.objid)
                   OR (d.classid = 'pg_class'::regclass AND ty.typrelid = d.objid)
                WHERE ty.typtype <> 'e' OR current_query() ~* 'rename[[:space:]]+value'
              UNION
                SELECT x.oid FROM used u, LATERAL (
                    SELECT ty.oid FROM pg_type ty  -- its domains and arrays
                    WHERE ty.typbasetype = u.oid OR ty.typelem = u.oid
                    UNION ALL SELECT c.reltype FROM pg_attribute a  -- composites holding it
                    JOIN pg_class c ON c.oid = a.attrelid
                    WHERE a.atttypid = u.oid AND c.relkind = 'c' AND NOT a.attisdropped
                    UNION ALL SELECT r.rngtypid FROM pg_range r WHERE r.rngsubtype = u.oid
                    UNION ALL SELECT r.rngmultitypid FROM pg_range r WHERE r.rngtypid = u.oid
                ) x
            )
            SELECT c.oid FROM pg_publication_tables p
            JOIN pg_namespace n ON n.nspname = p.schemaname
            JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
            JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE p.pubname = {pub} AND a.atttypid IN (SELECT u.oid FROM used u)
          UNION
            SELECT coalesce(pg_partition_root(c.oid), c.oid)
            FROM pg_event_trigger_ddl_commands() d JOIN pg_class c ON c.oid = d.objid
            WHERE d.classid = 'pg_class'::regclass AND c.relkind = 'p');
    END IF;
    IF touched IS NOT NULL THEN  -- each table whose rows changed without a change in the WAL
        FOR t IN
            SELECT n.nspname, c.relname, c.oid FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY (touched)
        LOOP
            PERFORM pg_logical_emit_message(true, {rewritten}, json_build_array(
                t.nspname, t.relname, t.oid::text)::text);
        END LOOP;
        IF TG_EVENT <> 'ddl_command_end' OR TG_TAG <> 'ALTER TABLE' THEN
            RETURN;
        END IF;
        touched := NULL;  -- an ALTER TABLE goes on below (a published table attached, say)
    END IF;
    IF TG_EVENT = 'sql_drop' THEN  -- a captured table dropped: its records are gone with it
        FOR t IN
            SELECT DISTINCT o.schema_name, o.object_name FROM pg_event_trigger_dropped_objects() o
            WHERE o.object_type = 'table'
              AND (o.schema_name = ANY ({schemas}) OR (o.schema_name, o.object_name) IN (
                   SELECT * FROM unnest({listed_schemas}::text[], {listed_tables}::text[])))
        LOOP
            PERFORM pg_logical_emit_message(true, {dropped},
                                            json_build_array(t.schema_name, t.object_name)::text);
        END LOOP;
        -- An index or constraint dropped (a replica identity index, say): a published table
        -- may have lost its key with it.
        IF NOT EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() o
                       WHERE o.object_type IN ('index', 'table constraint')) THEN
            RETURN;
        END IF;
        touched := ARRAY(SELECT r.prrelid FROM pg_publication_rel r WHERE r.prpubid = pub);
    ELSE
        touched := ARRAY(SELECT d.objid FROM pg_event_trigger_ddl_commands() d
                         WHERE d.classid = 'pg_class'::regclass);
    END IF;
    -- A partition's replica identity is its root's concern: Postgres checks each partition's
    -- when the root is published.
    touched := ARRAY(SELECT DISTINCT coalesce(pg_partition_root(o), o) FROM unnest(touched) o);
    -- The publication's lock may be held (by another transaction that made a table): a wait
    -- the user's statement_timeout would cancel, which no handler catches, ends at half the
    -- time left instead, and capture makes the change (MISSED).
    SELECT greatest(1, (s.setting::int - 1000 * extract(epoch FROM clock_timestamp()
                                                             - statement_timestamp())) / 2)
    INTO wait_ms FROM pg_settings s WHERE s.name = 'statement_timeout' AND s.setting::int > 0;
    -- A published table attached as a partition: its rows are its root's now (published under
    -- it). Its own collection ends as a dropped table's does, and the root is backfilled.
    FOR t IN
        SELECT n.nspname, c.relname, root.oid AS root_oid, rn.nspname AS root_schema,
               root.relname AS root_name
        FROM pg_publication_rel r
        JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_class root ON root.oid = pg_partition_root(c.oid)
        JOIN pg_namespace rn ON rn.oid = root.relnamespace
        WHERE r.prpubid = pub AND c.relispartition AND root.oid = ANY (touched)
    LOOP
        BEGIN
            IF wait_ms IS NOT NULL THEN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            END IF;
            EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I', {pub}, t.nspname,
                           t.relname);
            PERFORM set_config('lock_timeout', user_lock_timeout, true);
            PERFORM pg_logical_emit_message(true, {dropped},
                                            json_build_array(t.nspname, t.relname)::text);
            PERFORM pg_logical_emit_message(true, {prefix}, json_build_array(
                t.root_schema, t.root_name, t.root_oid::text)::text);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'weir: publication % not changed for %: %', {pub}, t.relname, SQLERRM;
        END;
    END LOOP;
    FOR t IN
        SELECT c.oid, n.nspname, c.relname, c.relkind,
            EXISTS (SELECT 1 FROM pg_publication_rel r
                    WHERE r.prpubid = pub AND r.prrelid = c.oid) AS published,
            {identity_c} AND (c.relreplident <> 'f' OR EXISTS (
                 SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
                 OR (n.nspname, c.relname) IN (
                 SELECT * FROM unnest({keyed_schemas}::text[], {keyed_tables}::text[])))
            AND NOT EXISTS (SELECT 1 FROM pg_partition_tree(c.oid) pt
                            JOIN pg_class l ON l.oid = pt.relid
                            WHERE pt.isleaf AND l.oid <> c.oid AND NOT {identity_l})
            AS capturable
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = ANY (touched) AND c.relkind IN ('r', 'p')
          AND NOT c.relispartition AND c.relpersistence = 'p'
          AND obj_description(c.oid, 'pg_class') IS DISTINCT FROM {mark}
          AND (n.nspname = ANY ({schemas}) OR (n.nspname, c.relname) IN (
               SELECT * FROM unnest({listed_schemas}::text[], {listed_tables}::text[])))
    LOOP
        IF t.published AND t.capturable AND TG_TAG = 'ALTER TABLE' THEN  -- renamed, say
            PERFORM pg_logical_emit_message(true, {altered}, json_build_array(
                t.nspname, t.relname, t.oid::text)::text);
        END IF;
        IF pub IS NOT NULL AND NOT t.capturable AND NOT t.published
           AND TG_TAG <> 'ALTER TABLE' THEN  -- made so: the user hears why it is left out
            PERFORM pg_logical_emit_message(true, {keyless},
                                            json_build_array(t.nspname, t.relname)::text);
        END IF;
        CONTINUE WHEN pub IS NULL OR t.published = t.capturable;
        BEGIN
            IF wait_ms IS NOT NULL THEN
                PERFORM set_config('lock_timeout', wait_ms || 'ms', true);
            END IF;
            IF t.capturable THEN
                EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s%I.%I', {pub},
                               CASE t.relkind WHEN 'r' THEN 'ONLY ' ELSE '' END,
                               t.nspname, t.relname);
                IF TG_TAG <> 'CREATE TABLE' THEN  -- its oid: it may be renamed before capture
                    PERFORM pg_logical_emit_message(true, {prefix}, json_build_array(
                        t.nspname, t.relname, t.oid::text)::text);
                END IF;
            ELSE
                EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I.%I', {pub}, t.nspname,
                               t.relname);
                PERFORM pg_logical_emit_message(true, {left},
                                                json_build_array(t.nspname, t.relname)::text);
            END IF;
            PERFORM set_config('lock_timeout', user_lock_timeout, true);
        EXCEPTION WHEN others THEN  -- a lock timeout, say: capture hears of it
            RAISE WARNING 'weir: publication % not changed for %: %', {pub}, t.relname, SQLERRM;
            PERFORM pg_logical_emit_message(true, {missed},
                                            json_build_array(t.nspname, t.relname, SQLERRM)::text);
        END;
    END LOOP;
EXCEPTION WHEN others THEN
    RAISE WARNING 'weir: %', SQLERRM;
END
{q}
"""


def identity_sql(rel: str) -> str:
    """SQL: whether the table ``rel`` (an alias of ``pg_class``) has a replica identity that
    Postgres accepts for the updates and deletes of a published table. A deferrable primary
    key is none."""
    return (
        f"({rel}.relreplident = 'f' OR ({rel}.relreplident = 'i' AND EXISTS ("
        f"SELECT 1 FROM pg_index i WHERE i.indrelid = {rel}.oid AND i.indisreplident)) OR ("
        f"{rel}.relreplident = 'd' AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = "
        f"{rel}.oid AND i.indisprimary AND i.indimmediate)))"
    )


def object_name(kind: str, publication: str) -> str:
    """``weir_{kind}_{publication}``, or when that is past Postgres's 63 bytes, the start of the
    publication's name and a hash of all of it (names that share a start stay apart)."""
    name = f"weir_{kind}_{publication}"
    if len(name.encode()) <= 63:
        return name
    return f"weir_{kind}_{publication[:40]}_{hashlib.sha256(publication.encode()).hexdigest()[:8]}"


def follow_tables(conn: psycopg.Connection[Any], src: PostgresSource) -> None:
    """Install the event trigger that adds tables created in ``schemas:``, or made anew under a
    name ``tables:`` lists (dropped and created again), to the publication. Its function lives
    in a schema of Weir's own (``HOME``), where no reset of the user's schemas takes it away.

    Creating an event trigger needs a superuser; without one, tables created while Weir runs
    are added at its next start and backfilled then (see capture), and a warning says so.
    """
    listed = [parse_table(t) for t in src.tables]
    names = {k: object_name(k, src.publication) for k in ("follow", "drop", "rewrite")}
    fn = sql.Identifier(HOME, names["follow"])
    trigger, drop = sql.Identifier(names["follow"]), sql.Identifier(names["drop"])
    rewrite = sql.Identifier(names["rewrite"])
    composed = (
        sql.SQL(_FOLLOW_FUNCTION)
        .format(
            q=sql.SQL("\0"),  # no literal holds a NUL: where the quotes go
            fn=fn,
            store_ddl=sql.Literal(STORE_DDL),
            mark=sql.Literal(STORE_MARK),
            identity_c=sql.SQL(identity_sql("c")),
            identity_l=sql.SQL(identity_sql("l")),
            pub=sql.Literal(src.publication),
            schemas=sql.Literal(list(src.schemas)),
            listed_schemas=sql.Literal([s for s, _ in listed]),
            listed_tables=sql.Literal([t for _, t in listed]),
            keyed_schemas=sql.Literal([parse_table(t)[0] for t in src.key_columns]),
            keyed_tables=sql.Literal([parse_table(t)[1] for t in src.key_columns]),
            prefix=sql.Literal(BACKFILL_PREFIX),
            dropped=sql.Literal(DROPPED_PREFIX),
            missed=sql.Literal(MISSED_PREFIX),
            left=sql.Literal(LEFT_PREFIX),
            altered=sql.Literal(ALTERED_PREFIX),
            keyless=sql.Literal(KEYLESS_PREFIX),
            rewritten=sql.Literal(REWRITTEN_PREFIX),
        )
        .as_string(conn)
    )
    quote = "$weir$"
    while quote in composed:  # a name may hold one
        quote = quote[:-1] + "_$"
    body = composed.replace("\0", quote)
    # Made anew only when it changed (a hash of it is the function's comment): every capture
    # session comes here, and DDL takes locks the user's statements would wait for.
    version = "weir:" + hashlib.sha256((body + _TAGS).encode()).hexdigest()[:16]
    installed = conn.execute(
        "SELECT obj_description(p.oid, 'pg_proc'), (SELECT count(*) FROM pg_event_trigger t"
        "  WHERE t.evtfoid = p.oid AND t.evtenabled <> 'D' AND t.evtname IN (%s, %s, %s))"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname = %s",
        (names["follow"], names["drop"], names["rewrite"], HOME, names["follow"]),
    ).fetchone()  # fmt: skip
    if installed == (version, 3):
        return
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(HOME)))
            conn.execute(body)
            conn.execute(sql.SQL("COMMENT ON FUNCTION {}() IS {}").format(fn, sql.Literal(version)))
            for name in (trigger, drop, rewrite):
                conn.execute(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(name))
            conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
                sql.Identifier(OLD_HOME, names["follow"])))  # fmt: skip
            conn.execute(
                sql.SQL(
                    f"CREATE EVENT TRIGGER {{}} ON ddl_command_end WHEN TAG IN {_TAGS}"
                    " EXECUTE FUNCTION {}()"
                ).format(trigger, fn)
            )
            for name, event in ((drop, "sql_drop"), (rewrite, "table_rewrite")):
                conn.execute(sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}()").format(
                    name, sql.SQL(event), fn))  # fmt: skip
    except psycopg.errors.InsufficientPrivilege:
        log.warning(
            "source %s: cannot follow tables as they are created (an event trigger needs a "
            "superuser): a table created (or made anew) while Weir runs is captured from "
            "Weir's next start on, and its earlier rows are backfilled then; a table that loses "
            "its key (primary key dropped) stays in the publication, where Postgres refuses its "
            "updates and deletes until it has one again or Weir's next start takes it out",
            src.name,
        )  # fmt: skip
