"""Followed schemas as users run them: the store inside a followed schema, tables that lose or
never had a usable key, names that quote badly, schemas dropped whole, publications a DBA
manages, and rows the store refuses. The check is the user's: their writes never fail, the
records stream equals the table, or the change is on the source's failed list saying why."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from core.runtime.service import prepare
from core.sources.pg.errors import SourceSetupError
from core.store import Store, StoreError
from core.store.status import backfills
from tests.helpers import stored
from tests.helpers.capture import wait_for
from tests.helpers.sql import execute, rows, wait_records
from tests.helpers.weir import Running, serving, weir_config


def _live(url: str, collection: str, schema: str = "weir") -> dict[str, Any]:
    return {r["record_id"]: r["record"] for r in stored.records(url, schema, live_only=True)
            if r["collection_id"] == collection}  # fmt: skip


def _table(url: str, table: str, key: tuple[str, ...] = ("id",)) -> dict[str, Any]:
    """The table's rows by record id (its key's values joined by ',')."""
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(f"SELECT * FROM {table}").fetchall()
    return {",".join(str(r[k]) for k in key): dict(r) for r in rows}


def _published(url: str) -> set[str]:
    got = rows(url, "SELECT schemaname || '.' || tablename FROM pg_publication_tables"
                    " WHERE pubname = 'weir_pub'")  # fmt: skip
    return {r[0] for r in got}


def _failures(url: str) -> list[tuple[str, str, str, str]]:
    return [(str(c), str(r), str(a), str(e)) for c, r, a, e in rows(
        url, "SELECT collection_id, record_id, action, error FROM weir.source_failures"
             " ORDER BY commit_lsn, commit_idx, record_id")]  # fmt: skip


def test_the_store_inside_the_followed_schema(db_url: str) -> None:
    """``store: schema: public`` with ``schemas: [public]``: the store's tables are never
    published, so its own writes are not captured back into it; the user's tables are, also
    those made while Weir runs."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    cfg = weir_config(db_url, [], store={"url": db_url, "schema": "public"})
    with serving(cfg):
        execute(db_url, "INSERT INTO t VALUES (1, 'a'), (2, 'b')", "UPDATE t SET v = 'c'",
                "CREATE TABLE later (id int PRIMARY KEY)",
                "INSERT INTO later VALUES (7)")  # fmt: skip
        wait_records(db_url, "public:t", 2, schema="public")
        wait_records(db_url, "public:later", 1, schema="public")
        assert _live(db_url, "public:t", "public") == _table(db_url, "t")
        assert _published(db_url) == {"public.t", "public.later"}
        got = Counter(e["collection_id"] for e in stored.events(db_url, "public"))
        assert got == {"public:t": 4, "public:later": 1}  # nothing of its own, no loop


def test_a_schema_holding_tables_named_as_the_stores_is_refused(db_url: str) -> None:
    """A Rails ``schema_migrations`` in ``public`` is not Weir's: the store does not take it
    over (nor skip its migrations on the strength of it), it says to use a schema of its own."""
    execute(db_url, "CREATE TABLE schema_migrations (version varchar PRIMARY KEY)",
            "INSERT INTO schema_migrations VALUES ('20240101000000')")  # fmt: skip
    with pytest.raises(StoreError, match=r"\(schema_migrations, schema_migrations_pkey\): give"):
        Store(db_url, "public").prepare([])
    assert rows(db_url, "SELECT version FROM schema_migrations") == [("20240101000000",)]
    # An index left with the store's name by a table renamed would make its migrations fail.
    execute(db_url, "DROP TABLE schema_migrations", "CREATE TABLE records (id int PRIMARY KEY)",
            "ALTER TABLE records RENAME TO recs")  # fmt: skip
    with pytest.raises(StoreError, match=r"schema public holds .*\(records_pkey\): give"):
        Store(db_url, "public").prepare([])


def test_a_role_named_as_the_stores_schema_is_warned_of(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its "$user" search path finds the store's tables before the database's own."""
    execute(db_url, "CREATE TABLE events (id int PRIMARY KEY)")
    try:
        execute(db_url, "CREATE ROLE weir")
        Store(db_url).prepare([])
    finally:
        execute(db_url, "DROP ROLE weir")
    assert "store: role weir finds the store's tables before its own" in caplog.text
    assert "ALTER ROLE weir SET search_path = public" in caplog.text


@pytest.mark.parametrize(
    "lose,regain",
    [
        ("ALTER TABLE t DROP CONSTRAINT t_pkey", "ALTER TABLE t ADD PRIMARY KEY (id)"),
        (
            "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id) DEFERRABLE",
            "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id)",
        ),
        (
            "CREATE UNIQUE INDEX t_u ON t (v); ALTER TABLE t REPLICA IDENTITY USING INDEX t_u;"
            " DROP INDEX t_u",
            "ALTER TABLE t REPLICA IDENTITY DEFAULT",
        ),
    ],
    ids=["pk-dropped", "pk-deferrable", "identity-index-dropped"],
)
def test_a_table_that_loses_its_key_leaves_without_failing_writes(
    db_url: str, lose: str, regain: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Postgres refuses UPDATE and DELETE of a published table without a replica identity: the
    table leaves the publication (logged), the user's writes go on, other tables are captured,
    and once it has a key again its rows are backfilled."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
            "CREATE TABLE other (id int PRIMARY KEY)")  # fmt: skip
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO t SELECT i, i FROM generate_series(1, 5) i")
        wait_records(db_url, "public:t", 5)
        execute(db_url, lose)
        execute(db_url, "UPDATE t SET v = v + 10", "DELETE FROM t WHERE id = 1",
                "INSERT INTO t VALUES (6, 6)", "INSERT INTO other VALUES (1)")  # fmt: skip
        wait_records(db_url, "public:other", 1)
        assert "public.t" not in _published(db_url)
        assert "table public.t left the publication: it has no key now" in caplog.text
        execute(db_url, regain, "INSERT INTO t VALUES (7, 7)")
        wait_for(lambda: _live(db_url, "public:t") == _table(db_url, "t"), timeout=60,
                 what="the backfill once t has a key again")  # fmt: skip


def test_names_that_quote_badly_and_a_followed_schema_dropped_whole(db_url: str) -> None:
    """A schema named with ``$weir$`` (the trigger's own quoting) is followed like any other;
    dropping the first followed schema with CASCADE (many tables in one statement) leaves the
    trigger working for the rest and tombstones every record of the dropped tables."""
    odd = 'odd$weir$"name'
    quoted = '"odd$weir$""name"'
    execute(db_url, "CREATE SCHEMA first", f"CREATE SCHEMA {quoted}")
    cfg = weir_config(db_url, [], schemas=["first", odd])
    with serving(cfg):
        execute(db_url, *[f"CREATE TABLE first.t{i} (id int PRIMARY KEY)" for i in range(12)],
                *[f"INSERT INTO first.t{i} VALUES (1), (2)" for i in range(12)],
                f"CREATE TABLE {quoted}.x (id int PRIMARY KEY)",
                f"INSERT INTO {quoted}.x VALUES (1)")  # fmt: skip
        for i in range(12):
            wait_records(db_url, f"first:t{i}", 2)
        wait_records(db_url, f"{odd}:x", 1)
        execute(db_url, "DROP SCHEMA first CASCADE",
                f"CREATE TABLE {quoted}.y (id int PRIMARY KEY)",
                f"INSERT INTO {quoted}.y VALUES (1), (2)")  # fmt: skip
        wait_records(db_url, f"{odd}:y", 2)
        wait_for(lambda: rows(db_url, "SELECT count(*) FROM weir.record_index WHERE NOT deleted"
                                      " AND collection_id LIKE 'first:%'") == [(0,)],
                 what="the dropped schema's records tombstoned")  # fmt: skip


@pytest.mark.parametrize("on_unstorable", ["stop", "fail"])
def test_a_keyless_table_in_a_publication_weir_does_not_manage(
    db_url: str, on_unstorable: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A DBA's publication may hold a table without a key (inserts only): its rows have no
    record id. Capture stops naming the table, or puts them on the source's failed list and
    goes on with the other tables."""
    execute(db_url, "CREATE TABLE log (at int, msg text)", "CREATE TABLE t (id int PRIMARY KEY)",
            "CREATE PUBLICATION weir_pub FOR TABLE log, t")  # fmt: skip
    cfg = weir_config(db_url, [], create_publication=False, on_unstorable=on_unstorable)
    prepare(cfg)
    weir = Running(cfg)
    execute(db_url, "INSERT INTO log VALUES (1, 'x')", "INSERT INTO t VALUES (1)")
    # said at the start as what it is: not left out (a DBA's publication holds it)
    said = "it is in publication weir_pub, which Weir does not manage, so its changes reach"
    wait_for(lambda: said in caplog.text, what="the keyless table named at the start")
    assert "not capturing: table public.log" not in caplog.text
    if on_unstorable == "stop":
        assert weir.exit_status() == 1
        assert "cannot capture the insert of table public.log committed at 0/" in caplog.text
        return
    wait_records(db_url, "public:t", 1)
    weir.stop.set()
    assert weir.exit_status() == 0
    [(collection, record, action, error)] = _failures(db_url)
    assert (collection, record, action) == ("public:log", "", "insert")
    assert "cannot capture the insert of table public.log" in error


def test_a_keyless_table_is_named_once_at_a_start_with_a_backfill(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A table Weir cannot capture is named once, with the fix: the backfill listing the
    same tables does not name it again (it was named twice)."""
    execute(db_url, "CREATE TABLE nk (a int)", "CREATE TABLE k (id int PRIMARY KEY)",
            "INSERT INTO k VALUES (1)")  # fmt: skip
    with serving(weir_config(db_url, [], backfill={})):
        wait_records(db_url, "public:k", 1)
    assert caplog.text.count("not capturing: table public.nk has no primary key") == 1, caplog.text


def test_a_table_the_dba_adds_later_is_backfilled(db_url: str) -> None:
    """With ``create_publication: false`` a followed table missing from the publication is
    not captured (said at start); once the DBA adds it, its rows are backfilled and its
    changes captured."""
    execute(db_url, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
            "INSERT INTO b SELECT generate_series(1, 40)",
            "CREATE PUBLICATION weir_pub FOR TABLE a")  # fmt: skip
    with serving(weir_config(db_url, [], create_publication=False)):
        execute(db_url, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (41)")
        wait_records(db_url, "public:a", 1)
        assert _live(db_url, "public:b") == {}
        waiting = [(b.table, b.requested) for b in backfills(Store(db_url)) if not b.rows_read]
        assert waiting == [("public.b", "until it is in publication weir_pub")]  # weir status
        execute(db_url, "ALTER PUBLICATION weir_pub ADD TABLE b", "INSERT INTO b VALUES (42)")
        wait_for(lambda: _live(db_url, "public:b") == _table(db_url, "b"), timeout=60,
                 what="b backfilled once in the publication")  # fmt: skip


def _poison(url: str) -> None:
    """The store refuses (as for a value beyond one of its limits) any record whose id starts
    with ``poison``."""
    execute(url, "CREATE FUNCTION weir.poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                 " IF NEW.record_id LIKE 'poison%' THEN RAISE EXCEPTION 'too odd to store'"
                 " USING ERRCODE = '54000'; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON weir.record_index"
            " FOR EACH ROW EXECUTE FUNCTION weir.poison()")  # fmt: skip


@pytest.mark.parametrize("on_unstorable", ["stop", "fail"])
def test_a_change_the_store_refuses_is_charged_to_it_alone(
    db_url: str, on_unstorable: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One change the store refuses, in a transaction with others: stop names it; fail puts
    only it on the source's failed list with the store's reason, the rest is stored."""
    execute(db_url, "CREATE TABLE t (id text PRIMARY KEY, v int)")
    cfg = weir_config(db_url, [], on_unstorable=on_unstorable)
    prepare(cfg)
    _poison(db_url)
    weir = Running(cfg)
    execute(db_url, "BEGIN; INSERT INTO t VALUES ('a', 1), ('poison', 2), ('b', 3); COMMIT",
            "INSERT INTO t VALUES ('c', 4)")  # fmt: skip
    if on_unstorable == "stop":
        assert weir.exit_status() == 1
        assert "store refused the insert of public:t record poison committed at 0/" in caplog.text
        assert "too odd to store" in caplog.text
        return
    wait_records(db_url, "public:t", 3)
    weir.stop.set()
    assert weir.exit_status() == 0
    assert sorted(_live(db_url, "public:t")) == ["a", "b", "c"]
    [(collection, record, action, error)] = _failures(db_url)
    assert (collection, record, action) == ("public:t", "poison", "insert")
    assert "too odd to store" in error and "set on_unstorable" not in error
    assert "on the source's failed list (weir.source_failures): the store refused the insert of " \
           "public:t record poison" in caplog.text  # fmt: skip
    assert [e["record_id"] for e in stored.events(db_url)] == ["a", "b", "c"]


def test_a_row_the_store_refuses_in_a_backfill(db_url: str) -> None:
    """A backfill goes on past a row the store refuses: the row is on the source's failed
    list, every other row is in the records stream, and capture goes on."""
    execute(db_url, "CREATE TABLE t (id text PRIMARY KEY)")
    cfg = weir_config(db_url, [], on_unstorable="fail")
    prepare(cfg)
    _poison(db_url)
    with serving(cfg):
        execute(db_url, "CREATE TABLE bf AS SELECT i::text AS id FROM generate_series(1, 30) i"
                        " UNION ALL SELECT 'poison1'",
                "ALTER TABLE bf ADD PRIMARY KEY (id)")  # fmt: skip
        wait_records(db_url, "public:bf", 30)
        execute(db_url, "INSERT INTO bf VALUES ('31')")
        wait_records(db_url, "public:bf", 31)
    assert [f[:3] for f in _failures(db_url)] == [("public:bf", "poison1", "backfill")]


def test_a_table_that_leaves_and_comes_back_while_its_backfill_runs(db_url: str) -> None:
    """The running backfill's snapshot is older than the changes made while the table was out
    of the publication: another backfill follows it, and the records stream equals the
    table."""
    cfg = weir_config(db_url, [], backfill={"tables": [], "page_size": 5})
    with serving(cfg):
        execute(db_url, "CREATE TABLE ld AS SELECT i AS id, 0 AS v FROM generate_series(1, 5000) i",
                "ALTER TABLE ld ADD PRIMARY KEY (id)")  # fmt: skip
        wait_for(lambda: rows(db_url, "SELECT count(*) FROM weir.backfills WHERE rows_read > 0"
                                      " AND finished_at IS NULL") == [(1,)],
                 what="the backfill under way")  # fmt: skip
        execute(db_url, "ALTER TABLE ld DROP CONSTRAINT ld_pkey",
                "UPDATE ld SET v = 1 WHERE id % 5 = 0", "DELETE FROM ld WHERE id % 11 = 0",
                "ALTER TABLE ld ADD PRIMARY KEY (id)")  # fmt: skip
        wait_for(lambda: _live(db_url, "public:ld") == _table(db_url, "ld"), timeout=120,
                 what="the records stream equal to the table")  # fmt: skip


def test_a_table_moved_out_of_a_followed_schema_and_back(db_url: str) -> None:
    """Out of the followed schemas its changes are not taken (its records are tombstones, the
    log says so); back in, by ALTER TABLE SET SCHEMA or a schema renamed and renamed back, it
    is backfilled, also when that happens while Weir is down."""
    execute(db_url, "CREATE SCHEMA s3", "CREATE SCHEMA away",
            "CREATE TABLE m (id int PRIMARY KEY, v int)", "CREATE TABLE s3.t (id int PRIMARY KEY)",
            "INSERT INTO m VALUES (1, 1), (2, 2)", "INSERT INTO s3.t VALUES (1)")  # fmt: skip
    cfg = weir_config(db_url, [], schemas=["public", "s3"])
    with serving(cfg):
        wait_records(db_url, "public:m", 0)
        execute(db_url, "INSERT INTO m VALUES (3, 3)", "INSERT INTO s3.t VALUES (2)")
        wait_records(db_url, "public:m", 1)
        execute(db_url, "ALTER TABLE m SET SCHEMA away", "UPDATE away.m SET v = 10",
                "ALTER SCHEMA s3 RENAME TO s3x", "INSERT INTO s3x.t VALUES (3)",
                "DELETE FROM s3x.t WHERE id = 2")  # fmt: skip
        wait_records(db_url, "public:m", 0)
        wait_records(db_url, "s3:t", 0)
        execute(db_url, "ALTER TABLE away.m SET SCHEMA public", "INSERT INTO m VALUES (4, 4)",
                "ALTER SCHEMA s3x RENAME TO s3", "INSERT INTO s3.t VALUES (4)")  # fmt: skip
        wait_for(lambda: _live(db_url, "public:m") == _table(db_url, "m"), timeout=60,
                 what="m backfilled once back")  # fmt: skip
        wait_for(lambda: _live(db_url, "s3:t") == _table(db_url, "s3.t"), timeout=60,
                 what="s3.t backfilled once back")  # fmt: skip
        execute(db_url, "ALTER TABLE m SET SCHEMA away", "UPDATE away.m SET v = 20")
        wait_records(db_url, "public:m", 0)
    execute(db_url, "ALTER TABLE away.m SET SCHEMA public", "INSERT INTO m VALUES (5, 5)")
    with serving(cfg):
        wait_for(lambda: _live(db_url, "public:m") == _table(db_url, "m"), timeout=60,
                 what="m backfilled once back, while Weir was down")  # fmt: skip


def test_a_publication_for_all_tables_holding_the_store(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's own writes are in the DBA's publication too: capture takes none of them and
    does not answer them with writes of its own (a loop that kept a core busy and the WAL
    growing), and says nothing of them."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY)",
            "CREATE PUBLICATION weir_pub FOR ALL TABLES")  # fmt: skip
    with serving(weir_config(db_url, [], create_publication=False)):
        execute(db_url, "INSERT INTO t VALUES (1)")
        wait_records(db_url, "public:t", 1)
        time.sleep(1)

        def writes() -> int:
            got = rows(db_url, "SELECT n_tup_upd + n_tup_ins FROM pg_stat_user_tables"
                               " WHERE schemaname = 'weir' AND relname = 'sources'")  # fmt: skip
            return int(got[0][0])

        before = writes()
        time.sleep(3)
        assert writes() - before <= 8  # a position a second at most while nothing happens
        execute(db_url, "INSERT INTO t VALUES (2)")
        wait_records(db_url, "public:t", 2)
    assert "leaving out the changes of weir." not in caplog.text


def test_a_table_the_dba_takes_out_and_puts_back(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its changes while out of a publication Weir does not manage are not published: Weir
    says so, and backfills it once it is back, so the records stream equals the table."""
    execute(db_url, "CREATE TABLE a (id int PRIMARY KEY, v int)",
            "INSERT INTO a VALUES (1, 1), (2, 2)",
            "CREATE PUBLICATION weir_pub FOR TABLE a")  # fmt: skip
    with serving(weir_config(db_url, [], create_publication=False)):
        execute(db_url, "INSERT INTO a VALUES (3, 3)")
        wait_records(db_url, "public:a", 1)
        execute(db_url, "ALTER PUBLICATION weir_pub DROP TABLE a", "UPDATE a SET v = 10",
                "INSERT INTO a VALUES (4, 4)")  # fmt: skip
        wait_for(lambda: "table public.a was taken out of publication weir_pub" in caplog.text,
                 what="the warning")  # fmt: skip
        execute(db_url, "ALTER PUBLICATION weir_pub ADD TABLE a", "INSERT INTO a VALUES (5, 5)")
        wait_for(lambda: _live(db_url, "public:a") == _table(db_url, "a"), timeout=60,
                 what="a backfilled once back in the publication")  # fmt: skip


@pytest.mark.parametrize(
    "lose,regain",
    [
        ("ALTER TABLE pp_a REPLICA IDENTITY NOTHING; INSERT INTO pp VALUES (3, 'a', 'w')",
         "ALTER TABLE pp_a REPLICA IDENTITY DEFAULT"),
        ("CREATE TABLE pp_c (id int NOT NULL, r text NOT NULL, v text);"
         " ALTER TABLE pp_c REPLICA IDENTITY NOTHING;"
         " ALTER TABLE pp ATTACH PARTITION pp_c FOR VALUES IN ('c');"
         " INSERT INTO pp VALUES (3, 'c', 'w')",
         "ALTER TABLE pp_c REPLICA IDENTITY DEFAULT"),
    ],
    ids=["identity-nothing", "attached-without-key"],
)  # fmt: skip
def test_a_partition_without_a_replica_identity_takes_its_table_out(
    db_url: str, lose: str, regain: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Postgres checks each partition's replica identity when the partitioned table is
    published: one partition without it takes the table out (the user's updates and deletes
    go on), and it is backfilled once every partition has one again."""
    execute(db_url, "CREATE TABLE pp (id int, r text, v text, PRIMARY KEY (id, r))"
                    " PARTITION BY LIST (r)",
            "CREATE TABLE pp_a PARTITION OF pp FOR VALUES IN ('a')",
            "CREATE TABLE pp_b PARTITION OF pp FOR VALUES IN ('b')")  # fmt: skip
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO pp VALUES (1, 'a', 'x'), (2, 'b', 'y')")
        wait_records(db_url, "public:pp", 2)
        execute(db_url, lose)
        execute(db_url, "UPDATE pp SET v = 'z'", "DELETE FROM pp WHERE id IN (2, 3)")
        wait_for(lambda: "table public.pp left the publication" in caplog.text,
                 what="the warning")  # fmt: skip
        execute(db_url, regain, "INSERT INTO pp VALUES (4, 'a', 'v')")
        wait_for(lambda: _live(db_url, "public:pp") == _table(db_url, "pp", ("id", "r")),
                 timeout=60, what="pp backfilled once every partition has a key")  # fmt: skip


def test_a_table_made_while_another_transaction_holds_the_publication(db_url: str) -> None:
    """The trigger waits for the publication's lock (held by an open transaction that made a
    table) at most half of the user's statement_timeout, which would cancel their CREATE
    TABLE; capture then adds the table once it can, and backfills it."""
    with serving(weir_config(db_url, [])), psycopg.connect(db_url) as holder:
        holder.execute("CREATE TABLE x1 (id int PRIMARY KEY)")  # its transaction stays open
        started = time.monotonic()
        execute(db_url, "SET statement_timeout = '4s'; CREATE TABLE x2 (id int PRIMARY KEY);"
                        " INSERT INTO x2 VALUES (1), (2)")  # fmt: skip
        assert time.monotonic() - started < 4
        holder.execute("INSERT INTO x1 VALUES (1)")
        holder.commit()
        execute(db_url, "INSERT INTO x2 VALUES (3)")
        wait_records(db_url, "public:x1", 1)
        wait_for(lambda: _live(db_url, "public:x2") == _table(db_url, "x2"), timeout=60,
                 what="x2 added by capture and backfilled")  # fmt: skip


def _refused_start(db_url: str, role: str, table: str, *grants: str) -> str:
    """Why ``prepare`` (weir run's start) refuses ``role``, given ``grants``, its source
    capturing ``table``."""
    execute(db_url, f"CREATE ROLE {role} LOGIN REPLICATION", *grants)
    try:
        cfg = weir_config(db_url.replace("postgres@", f"{role}@"), [], schemas=[],
                          tables=[table], store={"url": db_url})  # fmt: skip
        with pytest.raises(SourceSetupError) as e:
            prepare(cfg)
    finally:
        execute(db_url, f"DROP OWNED BY {role}", f"DROP ROLE {role}")
    return str(e.value)


def test_a_role_that_cannot_create_the_publication_is_told_what_to_do(db_url: str) -> None:
    """Owning the tables is not enough: CREATE PUBLICATION needs CREATE on the database."""
    said = _refused_start(db_url, "owner_only", "public.t", "CREATE TABLE t (id int PRIMARY KEY)",
                          "ALTER TABLE t OWNER TO owner_only")  # fmt: skip
    assert said.startswith(
        "source 'app': role owner_only cannot create publication weir_pub (permission"
    )
    assert "as the database's owner run GRANT CREATE ON DATABASE " in said
    assert "TO owner_only; or have it made (CREATE PUBLICATION" in said
    assert "set create_publication: false" in said


def test_a_role_that_does_not_own_a_table_is_told_which_by_its_name(db_url: str) -> None:
    """CREATE on the database is not enough either: the line names the table it does not own
    as a config names it (a dotted name quoted), and the owner's statement."""
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    said = _refused_start(db_url, "not_owner", 'public."my.t"',
                          f'GRANT CREATE ON DATABASE "{dbname}" TO not_owner',
                          'CREATE TABLE "my.t" (id int PRIMARY KEY)',
                          'GRANT SELECT ON "my.t" TO not_owner')  # fmt: skip
    assert 'cannot create publication weir_pub (must be owner of table public."my.t"): as the ' \
           "tables' owner run CREATE PUBLICATION \"weir_pub\" FOR TABLE ONLY " \
           '"public"."my.t"' in said, said  # fmt: skip


def test_an_update_leaving_out_a_value_the_store_never_had(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Postgres leaves an unchanged TOASTed value out of an update; for a row captured from
    before Weir (never backfilled) the store has no version to take it from: the table is
    backfilled, and the record has every column of the row."""
    execute(
        db_url,
        "CREATE TABLE t (id int PRIMARY KEY, small text, big text)",
        "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO t SELECT i, 'a', repeat('x', 9999) FROM generate_series(1, 2) i",
    )
    with serving(weir_config(db_url, [])):
        execute(db_url, "UPDATE t SET small = 'c' WHERE id = 1")
        wait_for(lambda: _live(db_url, "public:t") == _table(db_url, "t"), timeout=60,
                 what="t backfilled")  # fmt: skip
    assert "records of public:t (1) lack columns their update left out" in caplog.text


def test_a_backfill_asked_for_a_table_renamed_since(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The request names the table as it was: the backfill of the old name has nothing to do
    (said as such, not as an error to fix), and the new name's records equal the table."""
    with serving(weir_config(db_url, [])):
        execute(db_url, "CREATE TABLE x AS SELECT generate_series(1, 20) AS id",
                "ALTER TABLE x ADD PRIMARY KEY (id)", "ALTER TABLE x RENAME TO y",
                "INSERT INTO y VALUES (21)")  # fmt: skip
        wait_for(lambda: _live(db_url, "public:y") == _table(db_url, "y"), timeout=60,
                 what="y backfilled")  # fmt: skip
        wait_for(lambda: not rows(db_url, "SELECT * FROM weir.backfill_requests"),
                 what="every request done")  # fmt: skip
    assert "not retried" not in caplog.text


def test_a_captured_table_attached_as_a_partition(db_url: str) -> None:
    """Loaded on its own, then attached (partition maintenance): its rows are the partitioned
    table's from then on. Its own collection ends (tombstones), the partitioned table is
    backfilled, and its changes arrive under the partitioned table."""
    execute(db_url, "CREATE TABLE pp (id int, r text, v text, PRIMARY KEY (id, r))"
                    " PARTITION BY LIST (r)",
            "CREATE TABLE pp_a PARTITION OF pp FOR VALUES IN ('a')")  # fmt: skip
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO pp VALUES (1, 'a', 'x')",
                "CREATE TABLE pp_c (id int, r text, v text, PRIMARY KEY (id, r))",
                "INSERT INTO pp_c VALUES (2, 'c', 'y'), (3, 'c', 'z')")  # fmt: skip
        wait_records(db_url, "public:pp_c", 2)
        execute(db_url, "ALTER TABLE pp ATTACH PARTITION pp_c FOR VALUES IN ('c')",
                "UPDATE pp SET v = 'w' WHERE id = 3")  # fmt: skip
        wait_records(db_url, "public:pp_c", 0)
        wait_for(lambda: _live(db_url, "public:pp") == _table(db_url, "pp", ("id", "r")),
                 timeout=60, what="pp with the attached rows")  # fmt: skip


def test_a_database_with_its_own_date_and_interval_styles(db_url: str) -> None:
    """Settings a database (or role) gives its sessions do not change what Weir reads: the
    store in such a database works, and values arrive as they do elsewhere."""
    db = db_url.rsplit("/", 1)[1]
    execute(db_url, f"ALTER DATABASE {db} SET datestyle = 'German, DMY'",
            f"ALTER DATABASE {db} SET intervalstyle = 'sql_standard'",
            "CREATE TABLE t (id int PRIMARY KEY, at timestamptz, span interval)")  # fmt: skip
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO t VALUES (1, '2026-11-24 07:00:00+00', '1 day 2 hours')",
                "CREATE TABLE b AS SELECT 1 AS id, now() AS at",
                "ALTER TABLE b ADD PRIMARY KEY (id)")  # fmt: skip
        wait_records(db_url, "public:t", 1)
        wait_records(db_url, "public:b", 1)
    assert _live(db_url, "public:t")["1"] == {
        "id": 1, "at": "2026-11-24T07:00:00.000000Z", "span": "P1DT2H"}  # fmt: skip


def test_a_table_renamed_and_not_written_to(db_url: str) -> None:
    """A rename is taken when it is made, not at the table's next change: the old name's
    records end, the new name's are backfilled."""
    execute(db_url, "CREATE TABLE rn (id int PRIMARY KEY, v text)")
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO rn VALUES (1, 'a'), (2, 'b')")
        wait_records(db_url, "public:rn", 2)
        execute(db_url, "ALTER TABLE rn RENAME TO rn3")
        wait_records(db_url, "public:rn", 0)
        wait_records(db_url, "public:rn3", 2)


def test_a_table_rewritten_with_new_values_of_the_same_type(db_url: str) -> None:
    """``ALTER COLUMN … TYPE text USING …`` changes every row with no change of a row in the
    WAL, and the columns stay as they were: the records stream kept the old values for good,
    and an update of another column then took the old TOASTed value from the store (found by
    an outside tryout). The rewrite asks for a backfill: the records equal the table again."""
    big = "(SELECT string_agg(md5(i::text || g::text), '') FROM generate_series(1, 400) g)"
    execute(db_url, "CREATE TABLE rw (id int PRIMARY KEY, payload text, small int)",
            f"INSERT INTO rw SELECT i, {big}, i FROM generate_series(1, 3) i")  # fmt: skip
    cfg = weir_config(db_url, [], backfill={"tables": ["public.rw"]})
    converged = lambda: _live(db_url, "public:rw") == _table(db_url, "rw")  # noqa: E731
    with serving(cfg):
        wait_for(converged, what="the first backfill")
        execute(db_url, "ALTER TABLE rw ALTER COLUMN payload TYPE text USING 'NEW' || payload",
                "UPDATE rw SET small = 101 WHERE id = 1")  # fmt: skip
        wait_for(converged, what="the records after the rewrite")
    assert all(r["payload"].startswith("NEW") for r in _live(db_url, "public:rw").values())


def test_an_enum_label_renamed_reaches_the_records_of_every_table_holding_it(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``ALTER TYPE … RENAME VALUE`` changes the text of every row that holds the label, with no
    change of a row in the WAL and no change of a column: the records stream kept the old
    label for good (found by an outside tryout). The tables holding it directly, in an array,
    a domain or a composite type are backfilled; one that does not hold it is left alone."""
    execute(db_url, "CREATE TYPE mood AS ENUM ('sad', 'ok')",
            "CREATE DOMAIN mood_d AS mood", "CREATE TYPE pair AS (m mood, n int)",
            "CREATE TABLE direct (id int PRIMARY KEY, m mood)",
            "CREATE TABLE nested (id int PRIMARY KEY, ms mood[], d mood_d, p pair)",
            "CREATE TABLE other (id int PRIMARY KEY, v text)",
            "INSERT INTO direct VALUES (1, 'sad'), (2, 'ok')",
            "INSERT INTO nested VALUES (1, '{sad,ok}', 'sad', '(sad,1)')",
            "INSERT INTO other VALUES (1, 'sad')")  # fmt: skip
    tables = ["public.direct", "public.nested", "public.other"]
    cfg = weir_config(db_url, [], backfill={"tables": tables})

    def table(name: str) -> dict[str, Any]:
        if name != "nested":
            return _table(db_url, name)
        got = rows(db_url, "SELECT id, to_jsonb(ms), d::text, p::text FROM nested")
        return {str(r[0]): dict(zip(("id", "ms", "d", "p"), r, strict=True)) for r in got}

    def converged(*names: str) -> bool:
        return all(_live(db_url, f"public:{n}") == table(n) for n in names)

    with serving(cfg):
        wait_for(lambda: converged("direct", "nested", "other"), what="the first backfills")
        execute(db_url, "ALTER TYPE mood ADD VALUE 'glad'", "ALTER TYPE mood RENAME TO feeling")
        time.sleep(1)  # no value's text changed: no backfill
        caplog.set_level(logging.INFO, logger="weir.backfill")
        caplog.clear()
        execute(db_url, "ALTER TYPE feeling RENAME VALUE 'sad' TO 'blue'")
        wait_for(lambda: converged("direct", "nested"), what="the records after the rename")
    started = {m.split()[1] for m in caplog.messages if m.startswith("backfill public.")}
    assert started == {"public.direct:", "public.nested:"}, caplog.messages  # not public.other
    assert _live(db_url, "public:direct")["1"] == {"id": 1, "m": "blue"}
    assert _live(db_url, "public:nested")["1"] == {"id": 1, "ms": ["blue", "ok"], "d": "blue",
                                                   "p": "(blue,1)"}  # fmt: skip


def test_the_records_stream_takes_a_tables_new_columns_without_a_write(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """ADD COLUMN with a default, DROP COLUMN and a column's new type, while Weir runs and
    while it is stopped, with no row written after: the records stream equals the table again
    (a backfill the change asks for). A table made without a key is named, with the fix."""
    caplog.set_level(logging.INFO, logger="weir.store")
    execute(db_url, "CREATE TABLE sh (id int PRIMARY KEY, v text)",
            "INSERT INTO sh SELECT i, 'v' || i FROM generate_series(1, 3) i")  # fmt: skip
    cfg = weir_config(db_url, [], backfill={"tables": ["public.sh"]})
    converged = lambda: _live(db_url, "public:sh") == _table(db_url, "sh")  # noqa: E731
    with serving(cfg):
        wait_for(converged, what="the first backfill")
        for ddl in ("ALTER TABLE sh ADD COLUMN c int DEFAULT 7", "ALTER TABLE sh DROP COLUMN v",
                    "ALTER TABLE sh ALTER COLUMN c TYPE text"):  # fmt: skip
            execute(db_url, ddl)
            wait_for(converged, what=f"the records after {ddl}")
        for said in ("+c", "-v", "~c"):  # the first backfill noted the table's columns
            assert f"the columns of public.sh changed ({said}): its records take" in caplog.text
        execute(db_url, "CREATE TABLE nokey (a serial, b text)")
        said = "not capturing: table public.nokey has no primary key"
        wait_for(lambda: said in caplog.text, what="the keyless table to be named")
        time.sleep(1)
        assert caplog.text.count(said) == 1, caplog.text  # once, by the one who noticed
        # Without the event trigger (no superuser): taken at the table's next change.
        execute(db_url, "ALTER EVENT TRIGGER weir_follow_weir_pub DISABLE",
                "ALTER TABLE sh ADD COLUMN e int DEFAULT 5",
                "UPDATE sh SET c = 'x' WHERE id = 1")  # fmt: skip
        wait_for(converged, what="the records after a column added with no event trigger")
    execute(db_url, "ALTER TABLE sh ADD COLUMN d jsonb DEFAULT '{\"k\": [1]}'")
    with serving(cfg):
        wait_for(converged, what="the records after a column added while Weir was stopped")
    assert stored.live_count(db_url, "public:sh") == 3
