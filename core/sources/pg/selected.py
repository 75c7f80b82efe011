"""Whether a connector's or an HTTP pull consumer's selection can match anything its Postgres
sources capture: each collection pattern against their tables, each filter's (or group's)
column against the columns of the tables it selects. A typo there (``public:custmers``, a
filter on ``stauts``) would otherwise send nothing, for ever, while the connector shows
``streaming``: what matches nothing is said at start and on every change over the API, with
the closest name.

Said, not refused: a table may be created after the connector (a followed schema).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import psycopg

from core.config.connector import ConnectorBase
from core.config.model import ConsumerConfig, WeirConfig
from core.config.sources import PostgresSource
from core.failures import Unreachable, away, reached
from core.ids import collection_id_of
from core.redact import Said, first_line, remember_names, said
from core.sources.pg import snapshot
from core.sources.pg.errors import SourceSetupError
from core.sources.pg.setup import (
    capturable_tables,
    left_out,
    publication_problem,
    slot_problem,
)
from core.sources.pg.tables import tables_of
from core.store.selection import glob
from core.tables import closest

COLUMNS_SQL = """
SELECT n.nspname, c.relname, a.attname FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
  AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY n.nspname, c.relname, a.attnum
"""


def catalog(src: PostgresSource) -> dict[str, list[str]]:
    """The collections ``src`` captures (its ``tables:`` and followed ``schemas:``), each
    with its columns."""
    with snapshot.connect(src.url.get_secret_value(), "weir-catalog") as conn:
        tables = tables_of(conn, src)
        rows = conn.execute(
            COLUMNS_SQL, ([s for s, _ in tables], [t for _, t in tables])
        ).fetchall()
    known: dict[str, list[str]] = {collection_id_of(s, t): [] for s, t in tables}
    for schema, table, column in rows:
        known[collection_id_of(schema, table)].append(column)
    # The source's names, not secrets: said as they are (a closest name among them too).
    remember_names([*known, *(c for columns in known.values() for c in columns)])
    return known


def unmatched(
    collections: Sequence[str], columns: Sequence[tuple[str, str]], known: dict[str, list[str]]
) -> list[Said]:
    """What in a selection matches nothing of ``known`` (collection -> columns): its collection
    patterns, and its ``columns`` (each (the setting, a column name)); each said with the
    closest name."""
    problems: list[Said] = []
    for pattern in collections:
        match = glob([pattern])
        if match is not None and not any(match(c) for c in known):
            problems.append(said("collections: %r matches none of its sources' tables%s",
                                 pattern, closest(pattern, known)))  # fmt: skip
    match = glob(collections)
    # the tables it selects; when none (a typo above), any of its sources'
    selected = [cols for c, cols in known.items() if match is None or match(c)] or known.values()
    pool = {col for cols in selected for col in cols}
    for setting, column in columns:
        if pool and column not in pool:
            problems.append(said("%s %r is in none of the tables it selects%s", Said(setting),
                                 column, closest(column, pool)))  # fmt: skip
    return problems


def selection_problems(
    cfg: WeirConfig, users: Sequence[ConnectorBase | ConsumerConfig]
) -> list[Said]:
    """``unmatched`` for each connector or HTTP pull consumer of ``users`` against the catalogs
    of its sources, each source's read once for them all, when they are all Postgres sources
    that answer (an ``http`` source's collections are whatever is sent; one that does not
    answer is capture's to report)."""
    read: dict[str, dict[str, list[str]] | None] = {}  # by source; None: it did not answer

    def known_to(sources: list[PostgresSource]) -> dict[str, list[str]] | None:
        known: dict[str, list[str]] = {}
        for src in sources:
            if src.name not in read:
                try:
                    read[src.name] = catalog(src)
                except (psycopg.Error, SourceSetupError):
                    read[src.name] = None
            if (tables := read[src.name]) is None:
                return None
            known |= tables
        return known

    problems: list[Said] = []
    for user in users:
        sources = [s for s in cfg.sources if user.sources is None or s.name in user.sources]
        pg = [s for s in sources if isinstance(s, PostgresSource)]
        if not sources or len(pg) < len(sources) or (known := known_to(pg)) is None:
            continue
        if isinstance(user, ConsumerConfig):
            what, collections = "consumer", [user.filters.collection_id]
            columns = [("group_columns:", c) for c in user.group_columns or []]
        else:
            what, collections = "connector", list(user.collections)
            columns = [("filters: column", f.column) for f in user.filters]
        problems += [said("%s %s: %s", Said(what), user.name, p)
                     for p in unmatched(collections, columns, known)]  # fmt: skip
    return problems


def catalog_problems(cfg: WeirConfig) -> tuple[list[Said], list[Said]]:
    """What the sources that answer say of the file, as ``weir run``'s start would: a refusal
    for good (a wrong password, a database that does not exist), the tables of ``tables:`` it
    could not capture, a publication that is missing (the DBA's) or that the role may not make,
    a slot it may not make or use (its start stops on them); and the tables the DBA's
    publication leaves out and the selections that match nothing (it warns of them). A source
    that does not answer (yet) is left to the start."""
    errors: list[Said] = []
    warnings: list[Said] = []
    for src in cfg.sources:
        if not isinstance(src, PostgresSource):
            continue
        url = src.url.get_secret_value()
        try:
            validate = functools.partial(snapshot.connect, name="weir-validate")
            with reached(url, f"source {src.name}", validate) as conn:
                tables = capturable_tables(conn, src, say=False)
                problems = [slot_problem(conn, src)]
                if src.create_publication:
                    problems.append(publication_problem(conn, src, tables))
                elif why := left_out(conn, src, tables)[1]:
                    warnings.append(why)
                errors += [p for p in problems if p is not None]
        except Unreachable as e:
            if not away(e):
                errors.append(Said(first_line(e)))
        except SourceSetupError as e:
            errors.append(Said(str(e)))
        except psycopg.Error:
            continue
    return errors, warnings + selection_problems(cfg, [*cfg.connectors, *cfg.consumers])
