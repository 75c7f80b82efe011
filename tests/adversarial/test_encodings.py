"""Every server encoding Postgres can create: text generated from each encoding's repertoire,
in values and in names, backfilled and captured (inserted, updated, deleted) by one Weir run
over a database of each, must reach the store and a NATS subscriber as a UTF-8 client reads it
from the table; what no UTF-8 client can read arrives as its bytes, one Latin-1 character each
(docs/design.md “Values”, core/sources/pg/encoding.py).

The encodings are listed by the server; each is created, or the test says why it cannot be.
Each database's repertoire is found by the server: a sample of the encoding's code space
(every single-byte code; a stride through each multibyte plane) sorted into characters it
converts to UTF-8, characters it holds but converts to nothing, and byte strings that are no
character. Every sampled character is stored as its bytes (so codes that UTF-8 text would
never produce are read too), and random text drawn from the repertoire (with the characters
COPY, arrays and JSON escape) is stored as a UTF-8 client writes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.config.model import WeirConfig
from core.ids import collection_id_of
from core.tables import table_name
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.adversarial.kinds import exact_json
from tests.connectors.nats.harness import NatsHarness
from tests.helpers import stored
from tests.helpers.capture import wait_for
from tests.helpers.weir import Running, serving

SEED = 20261127
PLANE = [bytes([a, b]) for a in range(0xA1, 0xFF) for b in range(0xA1, 0xFF)]  # 94 x 94


def code_sample(encoding: str) -> list[bytes]:
    """Byte strings of the encoding's code space to try, after pg_encoding_mblen."""
    if encoding == "UTF8":  # a stride through every plane's code points, surrogates left out
        points = [
            *range(0x80, 0x800, 3),
            *range(0x800, 0x10000, 97),
            *range(0x10000, 0x110000, 4099),
        ]
        return [chr(p).encode() for p in points if not 0xD800 <= p < 0xE000]
    if encoding == "SQL_ASCII":  # any byte: single high bytes, and UTF-8 pairs
        return [bytes([b]) for b in range(0x80, 0x100)] + [
            chr(p).encode() for p in range(0x80, 0x800, 7)
        ]
    if encoding in ("EUC_JP", "EUC_JIS_2004"):
        return [
            *PLANE[::7],
            *(b"\x8e" + bytes([b]) for b in range(0xA1, 0xFF)),
            *(b"\x8f" + c for c in PLANE[::23]),
        ]
    if encoding in ("EUC_KR", "EUC_CN"):
        return PLANE[::5]
    if encoding == "EUC_TW":  # CNS 11643 plane 1 as two bytes; planes 1-16 after SS2
        return [
            *PLANE[::7],
            *(b"\x8e" + bytes([p]) + c for p in range(0xA1, 0xB1) for c in PLANE[p % 41 :: 41]),
        ]
    if encoding in SINGLE_BYTE:
        return [bytes([b]) for b in range(0x80, 0x100)]
    raise AssertionError(f"no code space known for server encoding {encoding}: add it here")


SINGLE_BYTE = {
    "LATIN1", "LATIN2", "LATIN3", "LATIN4", "LATIN5", "LATIN6", "LATIN7", "LATIN8", "LATIN9",
    "LATIN10", "WIN1256", "WIN1258", "WIN866", "WIN874", "KOI8R", "WIN1251", "WIN1252",
    "ISO_8859_5", "ISO_8859_6", "ISO_8859_7", "ISO_8859_8", "WIN1250", "WIN1253", "WIN1254",
    "WIN1255", "WIN1257", "KOI8U",
}  # fmt: skip

# Sorts the sample: its UTF-8 (what the server converts it to), or whether it is a character
# at all (convert_from in the database's own encoding only checks the bytes).
CLASSIFY = """
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT n, b FROM weir_codes LOOP
        BEGIN
            UPDATE weir_codes SET utf8 = convert(r.b, current_setting('server_encoding'), 'UTF8'),
                                  valid = true WHERE n = r.n;
        EXCEPTION WHEN others THEN
            BEGIN
                PERFORM convert_from(r.b, current_setting('server_encoding'));
                UPDATE weir_codes SET valid = true WHERE n = r.n;
            EXCEPTION WHEN others THEN NULL;
            END;
        END;
    END LOOP;
END $$
"""

SPECIAL = ["\t", "\n", "\\", '"', "'", ",", "{", "}", " ", "NULL", "a"]  # COPY, arrays, JSON


class Database:
    """One database in one encoding, its repertoire, and its table as a UTF-8 client reads it."""

    def __init__(self, server: EmbeddedPostgres, encoding: str) -> None:
        self.encoding = encoding
        self.name = f"enc_{encoding.lower()}"
        self.url = server.url.rsplit("/", 1)[0] + "/" + self.name
        self.rnd = random.Random(f"{SEED}-{encoding}")
        self.chars: list[str] = []  # characters the server converts to UTF-8
        self.codes: list[bytes] = []  # their bytes
        self.unreadable: list[bytes] = []  # characters it holds and converts to nothing
        self.updates: list[tuple[str, Any]] = []  # (key, v before) of each captured update
        self.deleted: list[str] = []

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True, client_encoding="UTF8")

    def classify(self) -> None:
        sample = code_sample(self.encoding)
        if self.encoding == "SQL_ASCII":  # no repertoire: UTF-8 is read as UTF-8, the rest not
            for b in sample:
                try:
                    self.chars.append(b.decode())
                    self.codes.append(b)
                except UnicodeDecodeError:
                    self.unreadable.append(b)
            return
        with self.connect() as conn:
            conn.execute("CREATE TEMP TABLE weir_codes (n int PRIMARY KEY, b bytea, utf8 bytea,"
                         " valid bool NOT NULL DEFAULT false)")  # fmt: skip
            with conn.cursor() as cur, cur.copy("COPY weir_codes (n, b) FROM STDIN") as copy:
                for i, b in enumerate(sample):
                    copy.write_row((i, b))
            conn.execute(CLASSIFY)
            rows = conn.execute("SELECT b, utf8 FROM weir_codes WHERE valid ORDER BY n").fetchall()
        for b, utf8 in rows:
            if utf8 is None:
                self.unreadable.append(bytes(b))
            else:
                self.chars.append(bytes(utf8).decode())
                self.codes.append(bytes(b))
        assert len(self.chars) >= 16, f"{self.encoding}: {len(self.chars)} characters found"

    # -- what is stored --------------------------------------------------------------------

    def text(self, n: int) -> str:
        pool = self.rnd.choice([self.chars, self.chars + SPECIAL])
        return "".join(self.rnd.choice(pool) for _ in range(n))

    def create(self) -> None:
        """The table: its name and a column's in the encoding's own characters."""
        self.table = f"t_{self.encoding.lower()}_{self.text(2).strip() or 'x'}".replace("\x00", "")
        self.table = "".join(c for c in self.table if c.isprintable()) or "t"
        self.column = "v_" + "".join(c for c in self.rnd.sample(self.chars, 2) if c.isprintable())
        with self.connect() as conn:
            conn.execute(self.sql("CREATE TABLE {t} (k text PRIMARY KEY, {v} text, a text[],"
                                  " j jsonb)"))  # fmt: skip
            conn.execute(self.sql("ALTER TABLE {t} REPLICA IDENTITY FULL"))
        self.collection = collection_id_of("public", self.table)

    def fill(self, phase: str) -> None:
        """Rows of every kind: the sampled characters as their bytes (half of them in each
        phase), random text as a UTF-8 client writes it, and text no UTF-8 client can read."""
        insert = self.sql("INSERT INTO {t} VALUES (%s, convert_from(%s, %s), %s, %s)")
        write = self.sql("INSERT INTO {t} VALUES (%s, %s, %s, %s)")  # UTF-8 text
        half = len(self.codes) // 2
        codes = self.codes[:half] if phase == "backfill" else self.codes[half:]
        with self.connect() as conn:
            for i in range(0, len(codes), 40):
                raw = b"".join(codes[i : i + 40])
                conn.execute(insert, (f"{phase}-codes-{i}", raw, self.encoding, None, None))
            for i in range(6):
                key = f"{self.text(3)}#{phase}{i}"
                values = [self.text(self.rnd.randint(0, 3)) for _ in range(self.rnd.randint(0, 3))]
                doc = json.dumps({self.text(2): self.text(6)}, ensure_ascii=False)
                conn.execute(write, (key, self.text(self.rnd.randint(0, 30)), values, doc))
            if self.encoding == "SQL_ASCII" or self.unreadable:
                # Its bytes among characters it reads: the whole value arrives as its bytes.
                for j, b in enumerate(
                    self.rnd.sample(self.unreadable, min(3, len(self.unreadable)))
                ):
                    raw = self.codes[j % len(self.codes)] + b + b"x"
                    conn.execute(
                        insert, (f"{phase}-unreadable-{j}", raw, self.encoding, None, None)
                    )

    def sql(self, query: str) -> sql.Composed:
        """``query`` with ``{t}`` the table and ``{v}`` its text column."""
        return sql.SQL(query).format(t=sql.Identifier(self.table), v=sql.Identifier(self.column))

    def keys(self, conn: psycopg.Connection[Any]) -> list[str]:
        return sorted(r[0] for r in conn.execute(self.sql("SELECT k FROM {t}")).fetchall())

    def change(self) -> None:
        """Captured updates (the old value is in the event's ``changes``) and a delete."""
        with self.connect() as conn:
            picked = self.rnd.sample(self.keys(conn), 5)
            for k in picked[:4]:
                before = self.read(conn, k)[self.column]
                new = self.text(8)
                conn.execute(self.sql("UPDATE {t} SET {v} = %s WHERE k = %s"), (new, k))
                if before != new:
                    self.updates.append((k, before))
            conn.execute(self.sql("DELETE FROM {t} WHERE k = %s"), (picked[4],))
            self.deleted.append(picked[4])

    # -- the oracle ------------------------------------------------------------------------

    def read(self, conn: psycopg.Connection[Any], key: str) -> dict[str, Any]:
        """A row as a UTF-8 client reads it; a value none can read, as its bytes in Latin-1."""

        def one(query: str, *params: Any) -> Any:
            row = conn.execute(self.sql(query), (*params, key)).fetchone()
            assert row is not None
            return row[0] if len(row) == 1 else row

        a, j = one("SELECT a, j::text FROM {t} WHERE k = %s")
        value: Any
        if self.encoding == "SQL_ASCII":  # the bytes: UTF-8 when they are
            raw = one("SELECT convert_to({v}, 'SQL_ASCII') FROM {t} WHERE k = %s")
            value = None if raw is None else _utf8_or_bytes(bytes(raw))
        else:
            try:
                with conn.transaction():
                    value = one("SELECT {v} FROM {t} WHERE k = %s")
            except psycopg.errors.UntranslatableCharacter:
                raw = one("SELECT convert_to({v}, %s) FROM {t} WHERE k = %s", self.encoding)
                value = bytes(raw).decode("latin-1")
        return {"k": key, self.column: value, "a": a, "j": None if j is None else json.loads(j)}

    def table_as_read(self) -> dict[str, Any]:
        with self.connect() as conn:
            return {k: self.read(conn, k) for k in self.keys(conn)}


def _utf8_or_bytes(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b.decode("latin-1")


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedPostgres]:
    """A server of its own: a slot and a sender for each of some 35 databases."""
    settings = {"max_replication_slots": "64", "max_wal_senders": "64", "max_connections": "400"}
    with EmbeddedPostgres(settings=settings) as s:
        yield s


def create_databases(server: EmbeddedPostgres) -> tuple[list[str], dict[str, str]]:
    """Every encoding the server names, created; (those created, why the others cannot be)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT pg_encoding_to_char(i) FROM generate_series(0, 255) i"
            " WHERE pg_encoding_to_char(i) <> '' ORDER BY i").fetchall()]  # fmt: skip
        made, refused = [], {}
        for enc in names:
            try:
                conn.execute(f'CREATE DATABASE "enc_{enc.lower()}" ENCODING \'{enc}\''
                             " TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")  # fmt: skip
                made.append(enc)
            except psycopg.Error as e:
                refused[enc] = str(e).strip()
    return made, refused


def test_every_server_encoding_reads_as_a_utf8_client_reads_it(
    server: EmbeddedPostgres,
    nats_server: EmbeddedNats,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    made, refused = create_databases(server)
    # Why some cannot be: the client-only encodings (SJIS, BIG5, GBK, UHC, GB18030, JOHAB,
    # SHIFT_JIS_2004), whose characters' later bytes can be ASCII's, are no server encoding.
    assert refused and all("is not a valid encoding name" in why for why in refused.values()), (
        refused
    )
    assert set(refused) == {"SJIS", "BIG5", "GBK", "UHC", "GB18030", "JOHAB", "SHIFT_JIS_2004"}, (
        refused
    )
    assert len(made) >= 35, made

    # MULE_INTERNAL has no conversion to UTF-8: no UTF-8 client can connect, and weir run
    # refuses it, saying so (not retrying for ever).
    made.remove("MULE_INTERNAL")
    store_url = server.url.rsplit("/", 1)[0] + "/enc_utf8"
    mule = WeirConfig.model_validate({
        "sources": [{"name": "mule", "kind": "postgres", "schemas": ["public"],
                     "url": server.url.rsplit("/", 1)[0] + "/enc_mule_internal"}],
        "store": {"url": store_url}})  # fmt: skip
    with caplog.at_level(logging.ERROR):
        assert Running(mule).exit_status(timeout=60) == 1
    assert "MULE_INTERNAL, which Postgres converts to no UTF-8" in caplog.text
    # A table whose name no UTF-8 client can read (WIN1252's 0x81) is left out, saying so and
    # what to do; the schema's other tables are captured (it stopped capture of them all).
    win1252 = server.url.rsplit("/", 1)[0] + "/enc_win1252"
    with psycopg.connect(win1252, autocommit=True, client_encoding="WIN1252") as conn:
        conn.execute("CREATE SCHEMA odd")
        conn.execute("DO $$ BEGIN EXECUTE format('CREATE TABLE odd.%I (id int PRIMARY KEY)',"
                     " convert_from('\\x81', 'WIN1252')); END $$")  # fmt: skip
        conn.execute("CREATE TABLE odd.fine (k int PRIMARY KEY)")  # keyed as the others
    odd = WeirConfig.model_validate({
        "sources": [{"name": "odd", "kind": "postgres", "schemas": ["odd"], "url": win1252,
                     "slot": "weir_odd"}],
        "store": {"url": store_url}})  # fmt: skip
    with caplog.at_level(logging.WARNING), serving(odd):
        with psycopg.connect(win1252, autocommit=True) as conn:
            conn.execute("INSERT INTO odd.fine VALUES (1)")
        wait_for(lambda: stored.record(store_url, "odd:fine", "1") is not None,
                 what="the readable table's row")  # fmt: skip
    assert "is left out: its name has a character no UTF-8 client can read" in caplog.text
    with psycopg.connect(win1252, autocommit=True, client_encoding="WIN1252") as conn:
        conn.execute("DROP SCHEMA odd CASCADE")
        conn.execute("DROP PUBLICATION IF EXISTS weir_pub")
        conn.execute("SELECT pg_drop_replication_slot('weir_odd') FROM pg_replication_slots"
                     " WHERE slot_name = 'weir_odd'")  # fmt: skip

    dbs = [Database(server, enc) for enc in made]
    for db in dbs:
        db.classify()
        db.create()
        db.fill("backfill")  # before Weir: only a backfill reads these

    nats = NatsHarness(nats_server)
    connector = nats.connector("enc-records", "records")
    nats.prepare(connector)
    cfg = WeirConfig.model_validate({
        "sources": [{"name": f"s_{db.encoding.lower()}", "kind": "postgres", "url": db.url,
                     "schemas": ["public"], "slot": f"weir_{db.encoding.lower()}",
                     "backfill": {"page_size": 7}} for db in dbs],
        "connectors": [connector], "store": {"url": store_url}})  # fmt: skip
    with serving(cfg):
        # The changes follow the backfills. (One older than a backfill's snapshot that capture
        # stores after the backfill wrote its row replaces the row's newer version: a race of
        # the store's writers, not of text, which this test leaves out.)
        wait_for(lambda: _backfilled(store_url) == len(dbs), timeout=120, what="the backfills")
        for db in dbs:
            db.fill("capture")
            db.change()
        want = {db.collection: db.table_as_read() for db in dbs}

        def store_has_all() -> bool:
            got = _store(store_url)
            return all(got.get(c) == w for c, w in want.items())

        with contextlib.suppress(AssertionError):  # a difference is named below
            wait_for(store_has_all, timeout=150, what="every database's table in the store")
        got = _store(store_url)
        assert not (diff := _differences(dbs, want, got)), f"the store: {diff}"
        with contextlib.suppress(AssertionError):
            wait_for(lambda: _subscriber(nats, connector) == want, timeout=60,
                     what="the NATS subscriber to hold every table")  # fmt: skip
        diff = _differences(dbs, want, _subscriber(nats, connector))
        assert not diff, f"the NATS subscriber: {diff}"

    # The seed job reads as backfills do, through COPY or JDBC (EUC_TW: no Python codec).
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE seeded")
    seeded = server.url.rsplit("/", 1)[0] + "/seeded"
    by = {db.encoding: db for db in dbs}
    for enc, jdbc in (("EUC_JP", False), ("EUC_TW", True)):
        seed(by[enc], seeded, tmp_path, jdbc)
        got = {c: rs for c, rs in _store(seeded).items() if c == by[enc].collection}
        assert not (diff := _differences([by[enc]], want, got)), f"seed ({jdbc=}): {diff}"

    events = stored.events(store_url)
    for db in dbs:
        mine = [e for e in events if e["collection_id"] == db.collection]
        updates = [e for e in mine if e["action"] == "update" and e["changes"]]
        olds = {(e["record"]["k"], json.dumps(e["changes"].get(db.column))) for e in updates}
        assert {(k, json.dumps(v)) for k, v in db.updates} <= olds, db.encoding
        gone = {e["record"]["k"] for e in mine if e["action"] == "delete"}
        assert set(db.deleted) <= gone, db.encoding


def seed(db: Database, store_url: str, tmp: Path, jdbc: bool) -> None:
    """``weir seed`` of the database's table (Spark, local[2]: COPY, or with a driver jar JDBC)
    into the store at ``store_url``."""
    config = tmp / f"{db.name}.yaml"
    config.write_text(json.dumps({
        "sources": [{"name": f"s_{db.encoding.lower()}", "kind": "postgres", "url": db.url,
                     "schemas": ["public"], "slot": f"weir_{db.encoding.lower()}"}],
        "store": {"url": store_url}}))  # fmt: skip
    import wbjdbc  # ships the PostgreSQL JDBC driver

    jar = Path(wbjdbc.__file__).parent / "resources/maven/postgresql/postgresql-42.7.4.jar"
    out = subprocess.run(
        [sys.executable, "-m", "core.cli", "seed", "--config", str(config), "--source",
         f"s_{db.encoding.lower()}", "--table", table_name("public", db.table), "--master",
         "local[2]", "--partitions", "2", *(["--jdbc-jar", str(jar)] if jdbc else [])],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]


def _differences(
    dbs: list[Database], want: dict[str, Any], got: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Per encoding whose table differs: a few (key, as read, as received)."""
    out = {}
    for db in dbs:
        w, g = want[db.collection], got.get(db.collection, {})
        if w != g:
            keys = sorted(k for k in w.keys() | g.keys() if w.get(k) != g.get(k))
            out[db.encoding] = [(k, w.get(k), g.get(k)) for k in keys[:3]]
    return out


def _backfilled(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM weir.backfills WHERE finished_at IS NOT NULL")
        return int(row.fetchone()[0])  # type: ignore[index]


def _store(url: str) -> dict[str, dict[str, Any]]:
    """The live records of each collection, by key, numbers exact."""
    out: dict[str, dict[str, Any]] = {}
    for r in stored.records(url, live_only=True):
        rec = exact_json(r["record_json"])
        out.setdefault(r["collection_id"], {})[rec["k"]] = rec
    return out


def _subscriber(nats: NatsHarness, connector: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What a NATS subscriber holds: the latest message of each record, live ones by key."""
    latest: dict[tuple[str, str], tuple[bool, Any]] = {}
    for d in nats.read(connector):
        payload = exact_json(d.raw)
        meta = payload["metadata"]
        latest[(meta["collection_id"], meta["record_id"])] = (meta["deleted"], payload["record"])
    out: dict[str, dict[str, Any]] = {}
    for (collection, _), (deleted, rec) in latest.items():
        if not deleted:
            out.setdefault(collection, {})[rec["k"]] = rec
    return out
