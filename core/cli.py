"""The ``weir`` command line (docs/operations.md “Management API and CLI”)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
from types import FrameType

from core.cli_operate import add_commands as add_operate_commands
from core.cli_transform import add_commands as add_transform_commands
from core.commands import (
    load_or_exit,
    postgres_source_or_exit,
    reach_store,
    source_problems,
    table_arg,
)
from core.config.settings import settings_or_exit
from core.failures import bound_postgres_connects, for_good, reach_postgres
from core.logs import setup_logging
from core.redact import first_line, redact_traceback
from core.registry import connector_specs, setup_of, spec_of

log = logging.getLogger("weir")


def cmd_validate(args: argparse.Namespace) -> int:
    """The file given as an argument, else as every command takes it (--config, $WEIR_CONFIG)."""
    path = args.file or args.config
    cfg = load_or_exit(path)
    from core.sources.pg.selected import catalog_problems

    errors, warnings = catalog_problems(cfg)  # against the sources that answer, as run's start
    for problem in errors:
        print(f"{path}: {problem}", file=sys.stderr)
    for problem in warnings:
        print(f"{path}: warning: {problem}", file=sys.stderr)
    if errors:
        return 2
    print(f"{path}: ok ({len(cfg.sources)} sources, {len(cfg.connectors)} connectors, "
          f"{len(cfg.consumers)} consumers)")  # fmt: skip
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Serve everything the file declares until SIGTERM/SIGINT; a second signal exits at once.
    By default a supervisor runs it in worker processes (core/runtime/supervisor.py)."""
    from core.runtime.service import serve
    from core.runtime.supervisor import Supervisor, die_with_parent, worker_named

    cfg = load_or_exit(args.config)
    grace = settings_or_exit().shutdown_grace
    if args.worker is not None:  # SIGINT (a terminal's ^C) is the supervisor's to forward
        die_with_parent(args.parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        worker = worker_named(cfg, args.worker)
        # SIGTERM may come twice, from the supervisor and to the process group (systemctl
        # stop, a terminal's ^C): a worker drains on the first; only the supervisor's second
        # signal exits at once (and takes the workers with it).
        stop = _stop_on_signals((signal.SIGTERM,), again_exits=False, say=False)
        try:
            return serve(cfg, stop, grace, worker)
        except Exception as e:
            if (why := for_good(e)) is not None:
                log.error("worker %s: %s", worker.name, why)
                return 1  # it will not go by itself: the supervisor stops, weir run exits 1
            log.error("worker %s: %s; it is started again", worker.name, first_line(e))
            return WORKER_CRASHED
    if args.single_process:
        return serve(cfg, _stop_on_signals(), grace)
    return Supervisor(args.config, cfg, _stop_on_signals(), grace).run()


WORKER_CRASHED = 3  # a worker's exit status for an error serve did not handle


def _stop_on_signals(
    signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
    again_exits: bool = True,
    say: bool = True,
) -> threading.Event:
    """An event these signals set, to drain and stop; a second signal exits at once (unless
    ``again_exits`` is False: then it is ignored). ``say``: log the signal (a worker's is
    the supervisor's to say)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            if again_exits:
                log.warning("second signal: exiting at once")
                os._exit(1)
            return
        if say:
            log.info("signal %s: draining", signal.Signals(signum).name)
        stop.set()

    for s in signals:
        signal.signal(s, on_signal)
    return stop


def cmd_backfill(args: argparse.Namespace) -> int:
    """Backfill tables of a source into its records stream, beside a running ``weir run``."""
    from core.sources.backfill import Backfill, configured_tables
    from core.store import open_store

    cfg = load_or_exit(args.config, api=False)
    src = postgres_source_or_exit(cfg, args.source)
    stop = _stop_on_signals()
    reach_postgres(src.url.get_secret_value(), f"source {src.name}")
    try:
        # Only beside capture: rows a backfill reads before the slot exists would miss the
        # changes made between its read and the slot (a store weir run has not made: refused).
        reach_store(cfg)
        store = open_store(cfg)
        tables = args.table or configured_tables(src)
        for table in tables:
            backfill = Backfill(
                src, store, table, page_size=args.page_size, sort_column=args.sort_column
            )
            result = backfill.run(stop, new="always" if args.restart else "if-finished")
            if not result.finished:
                print(f"weir backfill: stopped in {table} after {result.rows_read:,} rows; "
                      "run it again to resume", file=sys.stderr)  # fmt: skip
                return 1
            kept = result.rows_read - result.rows_written
            print(f"{table}: {result.rows_read:,} rows read, {result.rows_written:,} written "
                  f"({kept:,} not: equal to their record, or older than its version)")  # fmt: skip
    except source_problems() as e:
        print(f"weir backfill: {first_line(e)}", file=sys.stderr)
        return 1
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """``weir <type> setup``: the setup of the connector type's registry entry."""
    import asyncio

    ensure = setup_of(spec_of(args.command))
    import psycopg

    from core.store import Store
    from core.store.connectors import with_api_connectors

    cfg = load_or_exit(args.config, api=False)
    try:  # with an API, connectors made over it need their streams or topics too
        if cfg.api is not None:
            cfg = with_api_connectors(cfg, Store(cfg.store_url, cfg.store.schema_))
    except psycopg.errors.UndefinedTable:
        pass  # no `weir run` has made the store yet, so no connector was made over the API
    except psycopg.Error as e:
        print(f"weir {args.command} setup: cannot read the connectors made over the API from "
              f"the store ({type(e).__name__}): only the file's", file=sys.stderr)  # fmt: skip
    connectors = [c for c in cfg.connectors if c.type == args.command]
    if not connectors:
        print(f"{args.config}: no {args.command} connectors", file=sys.stderr)
        return 2
    status = 0
    for c in connectors:
        try:
            print("\n".join(asyncio.run(ensure(c))))
        except Exception as e:
            log.debug("%s: setup failed", c.name, exc_info=True)
            print(f"{c.name}: {first_line(e)}", file=sys.stderr)
            status = 1
    return status


def cmd_status(args: argparse.Namespace) -> int:
    """Sources (slot lag, last LSN), connectors (cursor lag, rate, failed), consumer queues
    and table backfills (rows read of the table's rows): two readings of the store
    ``--interval`` seconds apart, the rate from the cursors' moves between them; with
    ``--watch`` a reading every interval until ^C (core/status_view.py draws them).
    """
    from core.status_view import show

    cfg = load_or_exit(args.config, api=False)
    return show(cfg, reach_store(cfg), args.interval, args.watch)


def cmd_seed(args: argparse.Namespace) -> int:
    from spark.seed import seed_command

    return seed_command(args, load_or_exit(args.config, api=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weir", description="Postgres change streams, forwarded")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the sources and connectors of a config file")
    p.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    p.add_argument(
        "--single-process",
        action="store_true",
        help="run everything in this process, not in supervised worker processes",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a supervisor's worker: its name
    p.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # and the supervisor's pid
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("config", help="config file tools")
    csub = p.add_subparsers(dest="config_command", required=True)
    v = csub.add_parser("validate", help="check a config file")
    v.add_argument("file", nargs="?", help="the config file (or --config FILE)")
    v.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    v.set_defaults(func=cmd_validate)

    for spec in connector_specs():
        if spec.setup is None:
            continue
        p = sub.add_parser(spec.type, help=f"{spec.type} tools")
        ksub = p.add_subparsers(dest=f"{spec.type}_command", required=True)
        k = ksub.add_parser("setup", help=spec.setup_help)
        k.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
        k.set_defaults(func=cmd_setup)

    p = sub.add_parser("status", help="sources, connectors and consumers: lag, rate, failures")
    p.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between the readings (default 1)"
    )
    p.add_argument(
        "--watch", action="store_true", help="a reading every interval until ^C (in place)"
    )
    p.set_defaults(func=cmd_status)

    add_operate_commands(sub)
    add_transform_commands(sub)

    p = sub.add_parser("backfill", help="backfill tables of a source into its records stream")
    p.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    p.add_argument("--source", required=True, help="a postgres source of the config")
    p.add_argument("--table", action="append", type=table_arg, help="schema.table (repeatable; "
                   "default: the source's backfill: tables, else all its tables)")  # fmt: skip
    p.add_argument("--restart", action="store_true",
                   help="start again from the first row, even when unfinished")  # fmt: skip
    p.add_argument("--page-size", type=int, help="rows per page (default 5000)")
    p.add_argument("--sort-column", help="a NOT NULL column to page by before the key")
    p.set_defaults(func=cmd_backfill)

    from spark.seed import add_arguments

    p = sub.add_parser("seed", help="seed tables into the records stream with the Spark job")
    add_arguments(p)
    p.set_defaults(func=cmd_seed)

    from spark import stream

    spark = sub.add_parser("spark", help="Spark queries over Weir's streams")
    p = spark.add_subparsers(dest="spark_command", required=True).add_parser(
        "stream", help="a source's stream into Parquet files partitioned by collection"
    )
    stream.add_arguments(p)
    p.set_defaults(func=stream.stream_command)

    args = parser.parse_args(argv)
    settings = settings_or_exit()
    if "config" in args and args.config is None and not getattr(args, "file", None):  # reads one
        if settings.config is None:
            parser.error(f"{args.command}: give --config FILE (or set WEIR_CONFIG)")
        args.config = str(settings.config)
    setup_logging("debug" if args.verbose else settings.log_level)
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, logging.root.level))
    bound_postgres_connects()
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # its reader went away (weir status --watch | head): done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # one line, without secrets; the traceback with -v only
        if args.verbose:
            print(redact_traceback(traceback.format_exc()), file=sys.stderr, end="")
        print(f"weir {args.command}: {first_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
