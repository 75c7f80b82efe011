"""Secrets out of everything Weir prints (README “Guarantees”): logs, CLI errors, config
errors and the HTTP API's error bodies all pass through :func:`redact`.

Two rules, so that a secret is hidden whatever error carries it:

- the password of any URL-like text (``scheme://user:pass@``, also malformed ones such as
  ``nats:/u:pass@host``), and the value of ``password=``, ``token=``, ``api_key=`` and their
  kind (libpq conninfo strings, URL query parameters) becomes ``***``;
- every secret value Weir was given (:func:`remember`: the config's ``SecretStr`` values and
  the passwords in its URLs) becomes ``***`` wherever it appears, also percent-decoded,
  percent-encoded, JSON-escaped or as Python writes it in a repr.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any, TextIO
from urllib.parse import quote, unquote

from pydantic import BaseModel, SecretStr

MASK = "***"
MIN_LENGTH = 4  # shorter values are not searched for everywhere (they are no secret anyway)

_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*:/*[^\s:/@'\"]*:)([^\s'\"]*)@")
_KEY_VALUE = re.compile(
    r"(?i)(\b\w*(?:password|passwd|secret|token|key|signature|sig|auth|credential)=)"
    r"('[^']*'|[^\s&,;'\"]+)"
)


def url_password(text: str) -> str | None:
    """The password in a URL's user info, as written (``None`` when it has none)."""
    m = _USERINFO.search(text)
    return m.group(2) if m else None


def redact_urls(text: str) -> str:
    """``text`` with every URL's password and every ``password=`` value masked."""
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    return _KEY_VALUE.sub(lambda m: m.group(1) + MASK, text)


def _forms(value: str) -> set[str]:
    """The ways ``value`` may be written in an error message."""
    out = set()
    for v in {value, unquote(value)}:
        out |= {v, quote(v, safe=""), json.dumps(v)[1:-1], repr(v)[1:-1]}
    return out


def _pieces(password: str) -> list[str]:
    """A URL's password, and the runs of it between the characters that end a URL's parts
    (``@ : / ? #``): a password written with them unencoded is split there by a URL parser,
    which then reports pieces of it as a host, a port or a path (``failed to resolve host
    'piece'``)."""
    cuts = [m.start() for m in re.finditer("[@:/?#]", password)]
    starts, ends = [0, *(c + 1 for c in cuts)], [*cuts, len(password)]
    return [password[a:b] for a in starts for b in ends if b > a]


class Secrets:
    """Secret values to hide wherever they appear, in each of their spellings."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def remember(self, values: Iterable[str]) -> None:
        """Hide these values (and their passwords, when they are URLs) from now on."""
        found: set[str] = set()
        for value in values:
            # A URL's password, or a secret that is no URL (a password secrets_of found).
            password = url_password(value) or (None if "://" in value else value)
            for v in (value, *_pieces(password)) if password else (value,):
                found |= {f for f in _forms(v) if len(f) >= MIN_LENGTH}
        with self._lock:
            if found <= self._known:
                return
            self._known |= found
            longest_first = sorted(self._known, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, longest_first)))

    def redact(self, text: str) -> str:
        """``text`` without any secret: see the module's docstring."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return redact_urls(text)


_SECRETS = Secrets()  # what this process was given: every config it loaded


def remember(values: Iterable[str]) -> None:
    """Hide these values from everything this process prints (:func:`redact`)."""
    _SECRETS.remember(values)


def redact(text: str) -> str:
    """``text`` without a URL password or any secret this process was given."""
    return _SECRETS.redact(text)


def secrets_of(value: Any) -> list[str]:
    """The secrets a config (or any part of it) holds: its ``SecretStr`` values, and the
    passwords of the URLs among its other strings."""
    if isinstance(value, SecretStr):
        return [value.get_secret_value()]
    if isinstance(value, str):
        password = url_password(value)
        return [password] if password else []
    if isinstance(value, BaseModel):
        value = [getattr(value, name) for name in type(value).model_fields]
    elif isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in secrets_of(item)]
    return []


def raw_secrets(data: Any, model: type[BaseModel]) -> list[str]:
    """The secrets of data that ``model`` did not validate (a config file with mistakes): the
    strings under a key that is a ``SecretStr`` wherever ``model`` and the models in it have
    it, and the passwords of the URLs among the others."""

    def secret(prop: Any) -> bool:  # in the JSON schema: SecretStr is "format": "password"
        if isinstance(prop, dict):
            return prop.get("format") == "password" or any(map(secret, prop.values()))
        return isinstance(prop, list) and any(map(secret, prop))

    schema = model.model_json_schema(by_alias=True)
    props = [p for m in [schema, *schema.get("$defs", {}).values()]
             for p in m.get("properties", {}).items()]  # fmt: skip
    keys = {k for k, p in props if secret(p)} - {k for k, p in props if not secret(p)}

    def walk(data: Any, inside: bool) -> list[str]:
        if isinstance(data, str):
            return [data] if inside else secrets_of(data)
        if isinstance(data, dict):
            return [s for k, v in data.items() for s in walk(v, inside or k in keys)]
        if isinstance(data, list):
            return [s for v in data for s in walk(v, inside)]
        return []

    return walk(data, False)


def first_line(e: BaseException) -> str:
    """An exception as one redacted line: the first line of its message, else its type."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return redact(lines[0] if lines else type(e).__name__)


class RedactingFormatter(logging.Formatter):
    """Formats log records without secrets. Tracebacks only when ``tracebacks`` (``-v``);
    otherwise an exception logged with its traceback shows as its last line."""

    def __init__(self, fmt: str, tracebacks: bool) -> None:
        super().__init__(fmt)
        self.tracebacks = tracebacks

    def formatException(self, ei: Any) -> str:
        text = super().formatException(ei)
        return text if self.tracebacks else text.rstrip().rsplit("\n", 1)[-1]

    def formatStack(self, stack_info: str) -> str:
        return stack_info if self.tracebacks else ""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


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


SECRET_MASK = "**********"  # how pydantic shows a SecretStr


def shown(value: Any) -> Any:
    """JSON-like ``value`` (a model's ``model_dump(mode="json")``) as an answer may show it:
    every string redacted (URL passwords, remembered secrets; SecretStr fields are masked by
    the dump already)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v) for v in value]
    return value


def unmasked(new: Any, was_shown: Any, was: Any) -> Any:
    """``new`` (a config sent back to change one) with each value that is the masked one it
    was shown (``was_shown``, from :func:`shown`) put back to what it is (``was``), so that
    sending back what was read keeps the secrets instead of storing their masks."""
    if isinstance(new, dict) and isinstance(was_shown, dict) and isinstance(was, dict):
        return {k: unmasked(v, was_shown.get(k), was.get(k)) if k in was else v
                for k, v in new.items()}  # fmt: skip
    if isinstance(new, str) and new == was_shown and was is not None and new != was:
        return was
    return new


def masks_in(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Where a mask is left in JSON-like ``value`` (a secret the sender never had), or None."""
    if isinstance(value, str):
        return path if SECRET_MASK in value or f":{MASK}@" in value else None
    if isinstance(value, (dict, list)):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            if (found := masks_in(v, (*path, str(k)))) is not None:
                return found
    return None
