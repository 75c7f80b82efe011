"""The ``weir`` command line (DESIGN.md section 10)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from core.config import ConfigError, WeirConfig, load_config
from core.settings import WeirSettings

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
    from core.service import serve

    settings = WeirSettings()
    path = args.config or settings.config
    if path is None:
        print("weir run: give --config FILE (or set WEIR_CONFIG)", file=sys.stderr)
        return 2
    cfg = _load(str(path))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("second signal: exiting at once")
            os._exit(1)
        log.info("signal %s: draining", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return serve(cfg, stop, settings.shutdown_grace)


def cmd_nats_setup(args: argparse.Namespace) -> int:
    import asyncio

    from connectors.nats.config import NatsConnector
    from connectors.nats.setup import ensure_streams

    cfg = _load(args.config)
    connectors = [c for c in cfg.connectors if isinstance(c, NatsConnector)]
    if not connectors:
        print(f"{args.config}: no nats connectors", file=sys.stderr)
        return 2
    status = 0
    for c in connectors:
        try:
            lines = asyncio.run(ensure_streams(c))
        except Exception as e:
            lines, status = [f"{c.name}: cannot set up NATS: {type(e).__name__}: {e}"], 1
        print("\n".join(lines))
    return status


def cmd_demo(args: argparse.Namespace) -> int:
    from core.demo import run_demo

    return run_demo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="weir", description="Postgres change streams, forwarded")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the sources and connectors of a config file")
    p.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("config", help="config file tools")
    csub = p.add_subparsers(dest="config_command", required=True)
    v = csub.add_parser("validate", help="check a config file")
    v.add_argument("file")
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("nats", help="NATS tools")
    nsub = p.add_subparsers(dest="nats_command", required=True)
    n = nsub.add_parser("setup", help="create the JetStream streams the connectors publish into")
    n.add_argument("--config", required=True)
    n.set_defaults(func=cmd_nats_setup)

    p = sub.add_parser("demo", help="stream a sample table from an embedded Postgres")
    p.set_defaults(func=cmd_demo)

    args = parser.parse_args(argv)
    level = "debug" if args.verbose else WeirSettings().log_level
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
