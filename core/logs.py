"""The log lines of a ``weir`` process, without secrets (core/redact.py's policy): Weir's own words
(a record's format, the logger's name) as written; what a record carries (its arguments, its
exception) as it prints, masked by value; the config's names as they are.
"""

from __future__ import annotations

import copy
import logging
import sys
import threading
from collections.abc import Mapping
from typing import Any, TextIO

from core.redact import Printed, printed, redact_traceback, redact_urls


class _ShownArgs(dict[str, Any]):
    """A record's mapping of arguments: each value shown (``%(name)s``), and the mapping itself
    printed masked, keys too (``log.info("%s", {...})`` makes the dict the record's args)."""

    def __init__(self, args: Mapping[Any, Any]) -> None:
        super().__init__({k: printed(v) for k, v in args.items()})
        self.whole = Printed(args)

    def __str__(self) -> str:
        return str(self.whole)

    def __repr__(self) -> str:
        return repr(self.whole)


def _message(record: logging.LogRecord) -> str:
    """The record's message: its format as written (a format that is no text, an error logged
    as the message, is shown), its arguments shown. A format its arguments do not fit shows
    them after it: logging's own report of that would print them as they are."""
    msg = record.msg if isinstance(record.msg, str) else str(Printed(record.msg))
    if not record.args:
        return msg
    args: Any = (_ShownArgs(record.args) if isinstance(record.args, Mapping)
                 else tuple(map(printed, record.args)))  # fmt: skip
    try:
        return str(msg % args)
    except (TypeError, ValueError, KeyError):
        return f"{msg} (arguments that do not fit it: {args!r})"


class RedactingFormatter(logging.Formatter):
    """Formats log records without secrets: the values a record carries (its arguments) and
    its exception are redacted by value, the line by shape only, so that Weir's own words (the
    message's format, the logger's name) stay as written. Tracebacks only when ``tracebacks``
    (``-v``); otherwise an exception logged with its traceback shows as its last line."""

    def __init__(self, fmt: str, tracebacks: bool) -> None:
        super().__init__(fmt)
        self.tracebacks = tracebacks

    def formatException(self, ei: Any) -> str:
        text = redact_traceback(super().formatException(ei))
        return text if self.tracebacks else text.rstrip().rsplit("\n", 1)[-1]

    def formatStack(self, stack_info: str) -> str:
        return redact_traceback(stack_info) if self.tracebacks else ""

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)  # other handlers see the record as it was logged
        record.msg, record.args = _message(record), None
        return redact_urls(super().format(record))


class StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is at each record, not as it was at setup: a progress bar
    (core/progress.py) redirects it while drawn, to print log lines above itself."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # emit runs under the handler's lock
        super().emit(record)


def setup_logging(level: str) -> None:
    """The logging of a ``weir`` process: every line redacted, tracebacks only at the debug
    level (``-v``), and an exception that ends a thread logged (redacted) instead of printed."""
    handler = StderrHandler()
    debug = level.lower() == "debug"
    handler.setFormatter(
        RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", debug)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line a request, URL and all

    def thread_died(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            name = args.thread.name if args.thread is not None else "?"
            exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
            logging.getLogger("weir").error("thread %s died", name, exc_info=exc_info)

    threading.excepthook = thread_died
