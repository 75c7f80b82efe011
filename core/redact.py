"""Secrets out of everything Weir prints (docs/design.md “Guarantees”;
docs/configuration.md “Secrets”): one policy, three rules, each where it cannot mask what is no
secret.

- **By shape**, in any text (:func:`redact_urls`): the password of anything shaped like a URL's
  user info, also malformed or without a scheme (``nats//u:pass@host``, ``u:pass@host:9092``),
  and the value of ``password=``, ``token=``, ``api_key=`` and their kind become ``***``.
- **By field**, in a config as the API shows it (:func:`shown`): ``SecretStr`` fields are
  ``**********``, and so is a string under a key that names a credential (librdkafka's
  ``sasl.password``); every other value is shown as it is (URL passwords masked by shape), so
  what is read can be sent back.
- **By value**, in text Weir did not write (:func:`redact`): exception messages, what a remote
  answered, the values a log line carries (its arguments, as they print: core/logs.py), config
  and API error messages, failed-list errors, status details. Every secret Weir was given
  (:func:`remember`: the config's secret fields, the passwords of its URLs) becomes ``***`` in
  each of its spellings (raw, percent-encoded or -decoded, JSON-escaped, as Python's repr()
  writes it in a text or in its bytes, trimmed, its lines, a URL's ``user:password`` as Basic
  auth's base64), but only as a whole: not where it adjoins a word character on a side where
  it ends in one, so the password ``secret`` leaves ``secretnats`` alone. Weir's own words (log
  format strings, logger names, levels, file paths, key paths) are never searched, so a
  dictionary-like password (``weir``) cannot garble them; nor are the names a log line carries
  whole (:func:`known_name`: the config's, and the tables its sources capture).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote

from pydantic import BaseModel, SecretStr

MASK = "***"
SECRET_MASK = "**********"  # how pydantic shows a SecretStr
MAX_CUTS = 8  # delimiters in a password beyond which its pieces are not all paired (a body's
# text, not a password: all pairs of thousands of cuts stalled the API for minutes)
MIN_PIECE = 4  # shorter pieces of a secret (its lines, a password's parts) match too many words
LONG_LINE = 8  # a line of a secret this long is masked alone even when it is a word; a form this
# long and more than letters is masked also where it runs into a word

# A URL's user info in text: an optional scheme, slashes, user, ':', password, '@' (the last
# one before a space or quote, as a password may hold an unencoded '@').
_USERINFO = re.compile(
    r"(?<![\w+.-])(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*:)?/*[^\s:/@'\"]*:)"
    r"(?P<password>(?!//)[^\s'\"]*)@"
)
# The same in a whole value (a config field), where quotes and spaces are the password's own,
# and it may start with a '/' (not with '//': that is a scheme's, ``nats://u:p@h``).
_USERINFO_VALUE = re.compile(r"^(?P<head>[^@]*?:)(?P<password>(?!//).*)@", re.S)
_KEY_VALUE = re.compile(
    r"(?i)(\b\w*(?:password|passwd|secret|token|key|signature|sig|auth|credential)=)"
    r"('[^']*'|[^\s&,;'\"]+)"
)
# An HTTP credential (an ``Authorization`` header's value): a scheme, then the credentials, which
# a server may echo alone (``{"error": "invalid token", "token": "..."}``).
_AUTH_SCHEME = re.compile(
    r"(?i)^\s*(?:bearer|basic|token|digest|bot|negotiate|api-?key|key|jwt|oauth|splunk|sso-key)"
    r"\s+(?P<credentials>\S.*?)\s*$",
    re.S,
)
# A config key whose string value is a secret though not typed SecretStr (librdkafka's).
_CREDENTIAL_KEY = re.compile(r"(?i)(?:password|passwd|secret|token|credentials?|api_?key|\.pem)$")


def redact_urls(text: str) -> str:
    """``text`` with every URL's password and every ``password=`` value masked (by shape)."""
    text = _USERINFO.sub(lambda m: m.group("head") + MASK + "@", text)
    return _KEY_VALUE.sub(lambda m: m.group(1) + MASK, text)


def _redact_value(value: str) -> str:
    """A config value (whole) with the password of the user info it holds masked."""
    return redact_urls(_USERINFO_VALUE.sub(lambda m: m.group("head") + MASK + "@", value))


def _telling(line: str) -> bool:
    """Whether a line of a secret is one to mask alone: long, or more than a word (a word such
    as ``line`` is Weir's own too: its 422 for the header value ``line\n...`` read 'a ***
    break no header can carry')."""
    return len(line) >= LONG_LINE or (len(line) >= MIN_PIECE and not line.isalpha())


def _spellings(value: str) -> set[str]:
    """The ways ``value`` may be written in a message: escaped, encoded, trimmed, its lines."""
    variants = {value, value.strip(), " ".join(value.split())}
    variants |= {line.strip() for line in value.splitlines() if _telling(line.strip())}
    out = set()
    for v in variants | {unquote(v) for v in variants}:
        out |= {v, quote(v, safe=""), json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1]}
        out |= _quoted(v)
    return {s for s in out if s.strip()}


def _quoted(v: str) -> set[str]:
    """``v`` as Python's repr() and ascii() write it inside a longer text or its UTF-8 bytes
    (a tuple's or an error's text, ``b'...'``), whichever quote that one is in: in '...' its '
    is escaped, in "..." (only when it holds no ") it is not."""
    b = v.encode(errors="surrogatepass")
    out = {repr(v + '"')[1:-2], ascii(v + '"')[1:-2], repr(b + b'"')[2:-2]}
    if '"' not in v:
        out |= {repr("'" + v)[2:-1], ascii("'" + v)[2:-1], repr(b"'" + b)[3:-1]}
    return out


def _pieces(password: str) -> list[str]:
    """A URL's password, and the runs of it between the characters that end a URL's parts
    (``@ : / ? #``): a password written with them unencoded is split there by a URL parser,
    which then reports pieces of it as a host, a port or a path (``failed to resolve host
    'piece'``)."""
    cuts = [m.start() for m in re.finditer("[@:/?#]", password)]
    starts, ends = [0, *(c + 1 for c in cuts)], [*cuts, len(password)]
    if len(cuts) > MAX_CUTS:  # no password has that many: each run between them alone
        return [password[a:b] for a, b in zip(starts, ends, strict=True) if b - a >= MIN_PIECE]
    return [password[a:b] for a in starts for b in ends if b - a >= MIN_PIECE]


def _forms(value: str) -> set[str]:
    """What to search for of a secret value: the value itself unless it is a whole URL (its
    host is no secret), and of the user info it holds, the password, its pieces and the
    ``Authorization: Basic`` that an HTTP client makes of it; of an HTTP credential
    (``Bearer tok``), the credentials alone too."""
    m = _USERINFO_VALUE.search(value)
    out = set() if "://" in value and m else _spellings(value)
    if auth := _AUTH_SCHEME.match(value):  # the credentials are a secret whole, as the value
        out |= _spellings(auth.group("credentials"))
    if m and m.group("password"):
        user, password = m.group("head")[:-1].rsplit("/", 1)[-1], m.group("password")
        out |= _spellings(password) | {s for p in _pieces(password) for s in _spellings(p)}
        out.add(base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode())
    return out


def _whole(form: str) -> str:
    """A pattern for ``form`` where it does not run on into a word: ``secret`` is not masked
    in ``secretnats``. A form no word of others' text is (8 characters or more, and more than
    letters) is masked where it runs into one too: a receiver's ``xxx…Zq8-Hidden-Token``
    showed it (found by an outside tryout)."""
    if len(form) >= LONG_LINE and not form.isalpha():
        return re.escape(form)
    left = r"(?<!\w)" if re.match(r"\w", form[0]) else ""
    right = r"(?!\w)" if re.match(r"\w", form[-1]) else ""
    return left + re.escape(form) + right


class Secrets:
    """Secret values to hide wherever they appear, in each of their spellings."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.names: frozenset[str] = frozenset()  # the config's strings, its tables: no secret

    def remember(self, values: Iterable[str], names: Iterable[str] = ()) -> None:
        """Hide these values (and their passwords, when they hold a URL's) from now on;
        ``names`` are the config's other strings (see :func:`remember_config`)."""
        found = set(forms_of(values))
        with self._lock:
            self.names |= frozenset(names)
            if found <= self._known:
                return
            self._known |= found
            longest_first = sorted(self._known, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(_whole, longest_first)))

    def redact(self, text: str) -> str:
        """``text`` without any secret: see the module's docstring."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return redact_urls(text)


_SECRETS = Secrets()  # what this process was given: every config it loaded


def forms_of(values: Iterable[str]) -> list[str]:
    """What to search for of these secret values (each spelling, as :func:`remember` takes
    them), longest first, for :func:`masked`."""
    return sorted({f for v in values for f in _forms(v)}, key=len, reverse=True)


def masked(text: str, forms: list[str]) -> str:
    """``text`` with these forms (:func:`forms_of`) masked where they occur whole, without
    keeping them: a refused request's own secrets in its answer. Only the forms ``text``
    holds are searched for, so nothing is compiled for the others."""
    for form in forms:
        if form in text:
            text = re.sub(_whole(form), MASK, text)
    return text


def remember(values: Iterable[str]) -> None:
    """Hide these values from everything this process prints (:func:`redact`)."""
    _SECRETS.remember(values)


def remember_names(names: Iterable[str]) -> None:
    """Know these as names, as the config's are: the tables a source captures (of the schemas
    it follows too), which log lines print as they are."""
    _SECRETS.remember((), names)


def known_name(value: str) -> bool:
    """Whether ``value`` is one of the names this process knows (:func:`remember_config`,
    :func:`remember_names`): a log line prints it as it is."""
    return value in _SECRETS.names


def remember_config(cfg: BaseModel) -> None:
    """Hide the secrets of a loaded config (:func:`secrets_of`) from everything this process
    prints, and know its other strings (names, schemas, namespaces) as Weir's own words: a log
    line that carries one of them whole prints it, even when a password is the same word (the
    store's schema ``weir``, the compose file's password)."""
    _SECRETS.remember(secrets_of(cfg), names_of(cfg))


def redact(text: str) -> str:
    """``text``, written by someone other than Weir, without a URL password or any secret this
    process was given."""
    return _SECRETS.redact(text)


def credential(key: str) -> bool:
    """Whether a config key names a credential (``sasl.password``, ``client.secret``)."""
    return _CREDENTIAL_KEY.search(key) is not None


def secrets_of(value: Any) -> list[str]:
    """The secrets a config (or any part of it) holds: its ``SecretStr`` values, the strings
    under credential keys, and its other strings that hold user info (a ':' before an '@':
    a URL's password, also in a URL too broken to parse, with quotes or spaces in it)."""
    if isinstance(value, SecretStr):
        return [value.get_secret_value()]
    if isinstance(value, str):
        return [value] if _USERINFO_VALUE.search(value) else []
    if isinstance(value, BaseModel):
        value = [getattr(value, name) for name in type(value).model_fields]
    elif isinstance(value, dict):
        value = [SecretStr(v) if credential(str(k)) and isinstance(v, str) else v
                 for k, v in value.items()]  # fmt: skip
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in secrets_of(item)]
    return []


def names_of(value: Any) -> list[str]:
    """The strings of a config (or any part of it) that are no secret: what secrets_of leaves."""
    if isinstance(value, str):
        return [] if _USERINFO_VALUE.search(value) else [value]
    if isinstance(value, BaseModel):
        value = [getattr(value, name) for name in type(value).model_fields]
    elif isinstance(value, dict):
        value = [v for k, v in value.items() if not credential(str(k))]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in names_of(item)]
    return []


@functools.cache
def _secret_keys(model: type[BaseModel]) -> frozenset[str]:
    """The keys that are a ``SecretStr`` wherever ``model`` and the models in it have them."""

    def secret(prop: Any) -> bool:  # in the JSON schema: SecretStr is "format": "password"
        if isinstance(prop, dict):
            return prop.get("format") == "password" or any(map(secret, prop.values()))
        return isinstance(prop, list) and any(map(secret, prop))

    schema = model.model_json_schema(by_alias=True)
    props = [p for m in [schema, *schema.get("$defs", {}).values()]
             for p in m.get("properties", {}).items()]  # fmt: skip
    return frozenset({k for k, p in props if secret(p)} - {k for k, p in props if not secret(p)})


def raw_secrets(data: Any, model: type[BaseModel]) -> list[str]:
    """The secrets of data that ``model`` did not validate (a config file with mistakes): the
    strings under a key that is a ``SecretStr`` wherever ``model`` and the models in it have
    it or that names a credential, and the others that hold a URL's password."""
    keys = _secret_keys(model)

    def walk(data: Any, inside: bool) -> list[str]:
        if isinstance(data, str):
            return [data] if inside else secrets_of(data)
        if isinstance(data, dict):
            return [s for k, v in data.items()
                    for s in walk(v, inside or k in keys or credential(str(k)))]  # fmt: skip
        if isinstance(data, list):
            return [s for v in data for s in walk(v, inside)]
        return []

    return walk(data, False)


def first_line(e: BaseException) -> str:
    """An exception as one redacted line: the first line of its message, else its type
    (redacted whole first: a secret may span lines)."""
    lines = [line.strip() for line in redact(str(e)).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def shown(value: Any, key: str = "") -> Any:
    """JSON-like ``value`` (a model's ``model_dump(mode="json")``) as an answer may show it:
    secrets masked by field (SecretStr fields are by the dump already; strings under a
    credential ``key``), URL passwords by shape, every other value as it is."""
    if isinstance(value, str):
        return SECRET_MASK if credential(key) else _redact_value(value)
    if isinstance(value, dict):
        return {k: shown(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v, key) for v in value]
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
