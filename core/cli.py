"""The ``weir`` command line (DESIGN.md section 10)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from core.config import ConfigError, PostgresSource, WeirConfig, load_config
from core.store import Store

log = logging.getLogger("weir")


def _load(path: str) -> WeirConfig:
    try:
        return load_config(path)
    except ConfigError as e:
        print(f"weir: invalid config:\n{e}", file=sys.stderr)
        raise SystemExit(2) from None


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = _load(args.file)
    print(f"{args.file}: ok ({len(cfg.sources)} sources)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Serve everything the file declares until SIGTERM/SIGINT; a second signal exits at once."""
    from core.pg.capture import PostgresCapture

    cfg = _load(args.config)
    store = Store(cfg.store_url, cfg.store.schema_)
    store.prepare(cfg.sources)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("second signal: exiting at once")
            raise SystemExit(1)
        log.info("signal %s: draining", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    failures: list[BaseException] = []

    def supervise(capture: PostgresCapture) -> None:
        try:
            capture.run(stop)
        except Exception as e:
            log.error("source %s: %s", capture.src.name, e)
            failures.append(e)
            stop.set()

    threads = [
        threading.Thread(target=supervise, args=(PostgresCapture(s, store),), name=s.name)
        for s in cfg.sources
        if isinstance(s, PostgresSource)
    ]
    for t in threads:
        t.start()
    log.info("weir: running %d sources", len(threads))
    while any(t.is_alive() for t in threads):
        stop.wait(0.5)
    for t in threads:
        t.join()
    log.info("weir: stopped")
    return 1 if failures else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from core.demo import run_demo

    return run_demo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weir", description="Postgres change streams, forwarded")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the sources and connectors of a config file")
    p.add_argument("--config", required=True)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("config", help="config file tools")
    csub = p.add_subparsers(dest="config_command", required=True)
    v = csub.add_parser("validate", help="check a config file")
    v.add_argument("file")
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("demo", help="stream a sample table from an embedded Postgres")
    p.set_defaults(func=cmd_demo)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
