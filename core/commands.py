"""What the ``weir`` commands share (core/cli.py, spark/seed.py): the config or exit 2, the
``--table`` argument, a postgres source of the config, the errors reported in one line."""

from __future__ import annotations

import argparse
import sys

from psycopg import sql

from core.config.load import ConfigError, load_config
from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.failures import postgres_address, reach_postgres
from core.redact import said
from core.store import Store, StoreError
from core.tables import parse_table, table_name


def load_or_exit(path: str, *, api: bool = True) -> WeirConfig:
    """The config file, or exit 2 with every problem in it (``api=False``: without reading
    its ``api:``, for a command that does not serve it)."""
    try:
        return load_config(path, api=api)
    except ConfigError as e:
        print(f"weir: invalid config:\n{e}", file=sys.stderr)
        raise SystemExit(2) from None


def reach_store(cfg: WeirConfig) -> Store:
    """The store of a command that reads it: it answers, and a ``weir run`` has made its
    schema (else :class:`StoreError`, one line saying so)."""
    reach_postgres(cfg.store_url, cfg.store_named)
    store = Store(cfg.store_url, cfg.store.schema_)
    with store.connect() as conn:
        name = sql.Identifier(store.schema, "schema_migrations").as_string(conn)
        row = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
    if row is None or row[0] is None:
        where = postgres_address(cfg.store_url)
        raise StoreError(said("the store at %s has no schema %s yet: `weir run` makes it when "
                              "it first starts", where, store.schema))  # fmt: skip
    return store


def table_arg(text: str) -> str:
    """``--table``: schema.table (core/tables.py), or a usage error (exit 2)."""
    try:
        return table_name(*parse_table(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def postgres_source_or_exit(cfg: WeirConfig, name: str) -> PostgresSource:
    """The postgres source ``name`` of the config, or exit 2 saying what the config has."""
    try:
        return cfg.postgres_source(name)
    except KeyError as e:
        print(f"weir: {e.args[0]}", file=sys.stderr)
        raise SystemExit(2) from None


def source_problems() -> tuple[type[Exception], ...]:
    """What a command reading a source database (backfill, seed) reports in one line, exit 1,
    instead of a traceback: setup and schema problems, and errors from the database."""
    import psycopg

    from core.sources.pg.errors import SourceSetupError
    from core.sources.pg.relations import SourceSchemaError

    return (SourceSetupError, SourceSchemaError, psycopg.Error)
