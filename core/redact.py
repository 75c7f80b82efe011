"""Secrets out of everything Weir prints (docs/design.md “Guarantees”;
docs/configuration.md “Secrets”): one policy, three rules, each where it cannot mask what is no
secret.

- **By shape**, in any text (:func:`redact_urls`): the password of anything shaped like a URL's
  user info, also malformed or without a scheme (``nats//u:pass@host``, ``u:pass@host:9092``),
  a NATS URL's lone user info (``nats://TOKEN@host``: nats-py sends it as a token), and the
  value of ``password=``, ``token=``, ``api_key=`` and their kind become ``***``.
- **By field**, in a config as the API shows it (core/masks.py): ``SecretStr`` fields are
  ``**********``, and so is a string under a key that names a credential (librdkafka's
  ``sasl.password``); every other value is shown as it is (a URL's password, token and
  ``token=`` masked by shape; a filter's or step's text is data), and what is read can be sent
  back: a mask sent back where it was shown, in objects and lists, keeps the secret.
- **By value**, in text Weir did not write (:func:`redact`): exception messages, what a remote
  answered, the values a log line carries (its arguments, as they print: core/logs.py), config
  and API error messages, failed-list errors, status details. Every secret Weir was given
  (:func:`remember`: the config's secret fields, the passwords and NATS tokens of its URLs)
  becomes ``***`` in each of its spellings (core/spellings.py: raw, percent-encoded in any of
  urllib's ways or -decoded, JSON-escaped (also with escaped slashes), as Python's repr()
  writes it in a text or in its bytes, trimmed, its lines, a URL's ``user:password`` as Basic
  auth's base64 and Basic's base64 decoded), but only as a whole: not where it adjoins a word
  character on a side where it ends in one, so the password ``secret`` leaves ``secretnats``
  alone; one no word could be (8 characters or more, more than letters) in any case too.
  Weir's own words (log format strings, logger names, levels, file paths, key paths) are never
  searched, so a dictionary-like password (``weir``) cannot garble them; nor are the names a
  log line carries
  whole (:func:`known_name`: the config's, and the tables its sources capture).
"""

from __future__ import annotations

import functools
import numbers
import re
import threading
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, SecretStr

from core.spellings import MASK, NATS_TOKEN_VALUE, USERINFO_VALUE, caseless, forms, whole

SECRET_MASK = "**********"  # how pydantic shows a SecretStr
# A URL's user info in text: an optional scheme, slashes, user, ':', password, '@' (the last
# one before a space or quote, as a password may hold an unencoded '@').
_USERINFO = re.compile(
    r"(?<![\w+.-])(?P<head>(?:[A-Za-z][A-Za-z0-9+.-]*:)?/*[^\s:/@'\"]*:)"
    r"(?P<password>(?!//)[^\s'\"]*)@"
)
_KEY_VALUE = re.compile(
    r"(?i)(\b\w*(?:password|passwd|secret|token|key|signature|sig|auth|credential)=)"
    r"('[^']*'|[^\s&,;'\"]+)"
)
# A NATS URL's lone user info in text: a token (nats-py sends it as one).
_NATS_TOKEN = re.compile(r"(?i)(?<![\w+.-])(?P<head>(?:nats|tls|wss?)://)(?P<token>[^\s:/@'\"]+)@")

# A config key whose string value is a secret though not typed SecretStr (librdkafka's).
_CREDENTIAL_KEY = re.compile(r"(?i)(?:password|passwd|secret|token|credentials?|api_?key|\.pem)$")


def redact_urls(text: str, key_values: bool = True) -> str:
    """``text`` with every URL's password, NATS URL's token and (``key_values``) ``password=``
    value masked (by shape)."""
    text = _USERINFO.sub(lambda m: m.group("head") + MASK + "@", text)
    text = _NATS_TOKEN.sub(lambda m: m.group("head") + MASK + "@", text)
    return _KEY_VALUE.sub(lambda m: m.group(1) + MASK, text) if key_values else text


def redact_value(value: str) -> str:
    """A config value (whole) with the password of the user info it holds masked, and when it
    is a URL its ``token=`` and kin too: a filter's or a step's text (``token=plain``) is
    data, shown as it is."""
    value = USERINFO_VALUE.sub(lambda m: m.group("head") + MASK + "@", value)
    return redact_urls(value, key_values="://" in value)


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
            self._pattern = re.compile("|".join(map(whole, longest_first)))

    def redact(self, text: str) -> str:
        """``text`` without any secret: see the module's docstring."""
        if self._pattern is not None:
            text = self._pattern.sub(MASK, text)
        return redact_urls(text)


_SECRETS = Secrets()  # what this process was given: every config it loaded


def forms_of(values: Iterable[str]) -> list[str]:
    """What to search for of these secret values (each spelling, as :func:`remember` takes
    them), longest first, for :func:`masked`."""
    return sorted({f for v in values for f in forms(v)}, key=len, reverse=True)


def masked(text: str, forms: list[str]) -> str:
    """``text`` with these forms (:func:`forms_of`) masked where they occur whole, without
    keeping them: a refused request's own secrets in its answer. Only the forms ``text``
    holds are searched for (in any case where :func:`caseless`), so nothing is compiled for
    the others."""
    lower = text.lower()
    for form in forms:
        if form in text or (caseless(form) and form.lower() in lower):
            text = re.sub(whole(form), MASK, text)
            lower = text.lower()
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
    :func:`remember_names`), or an id made of one (a failed entry's ``SOURCE:SEQ``, a
    consumer's list ``consumer:NAME``): a log line prints it as it is."""
    names = _SECRETS.names
    head, colon, tail = value.rpartition(":")
    return value in names or bool(
        colon and ((head in names and tail.isdigit()) or (head == "consumer" and tail in names))
    )


def remember_config(cfg: BaseModel) -> None:
    """Hide the secrets of a loaded config (:func:`secrets_of`) from everything this process
    prints, and know its other strings (names, schemas, namespaces) as Weir's own words: a log
    line that carries one of them whole prints it, even when a password is the same word (the
    store's schema ``weir``, the compose file's password)."""
    _SECRETS.remember(secrets_of(cfg), names_of(cfg))


def redact(text: str) -> str:
    """``text``, written by someone other than Weir, without a URL password or any secret this
    process was given; a text Weir wrote (:class:`Said`) by shape only."""
    return redact_urls(text) if isinstance(text, Said) else _SECRETS.redact(text)


class Said(str):
    """A text Weir wrote (:func:`said`): its own words as written, each value of others in it
    masked as it was made. :func:`redact` leaves it to the rules by shape; an error with one
    as its message prints it so (:func:`first_line`, a log line's argument): a password that is
    a word (``weir``) garbles none of Weir's sentences nor the config's names in them."""

    __slots__ = ()


def said(template: str, *values: Any) -> Said:
    """``template % values`` as Weir's own text: each value as :class:`Printed` prints it."""
    return Said(template % tuple(printed(v) for v in values))


def printed(value: Any) -> Any:
    """A value a line of Weir's carries, as it may print: a number or None as it is (``%d``
    takes it), anything else as :class:`Printed`."""
    return value if value is None or isinstance(value, numbers.Number) else Printed(value)


class Printed:
    """A value whose str() and repr() are its own without secrets: masked whole, as it prints
    them, whatever it is (text, bytes, a tuple, a dict, an error, an object), so a secret
    inside it is masked in its own spelling and the rest is left as printed. One of the
    config's names (:func:`known_name`) prints as it is; Weir's own text (:func:`own`) by
    shape only."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        if (text := own(self.value)) is not None:
            return redact_urls(text)
        return self._printed(str(self.value))

    def __repr__(self) -> str:
        return self._printed(repr(self.value))

    def _printed(self, text: str) -> str:
        return text if isinstance(self.value, str) and known_name(self.value) else redact(text)


def own(value: Any) -> str | None:
    """The text of a value Weir wrote: a :class:`Said`, or an error whose message is one."""
    if isinstance(value, Said):
        return value
    if isinstance(value, BaseException) and len(value.args) == 1:
        text = value.args[0]
        if isinstance(text, Said) and str(value) == text:
            return text
    return None


# A traceback's lines that are Python's or code, not messages: its heads, where a frame is
# (its file's path, line and function); the lines of code after one, and the marks under them.
_FRAME = re.compile(
    r'^(?:\s*File "[^"\n]*", line \d+(?:, in .*)?|Traceback \(most recent call last\):|'
    r"During handling of the above exception, another exception occurred:|"
    r"The above exception was the direct cause of the following exception:)$"
)


def redact_traceback(text: str) -> str:
    """A traceback (``-v``) without secrets: its messages redacted (each error's, a chained
    one's), each whole (it may span lines); its frames as they are (the lines of code after a
    frame's line too): file paths, function names and code are never secrets
    (``self.***.list_topics``, ``site-packages/confluent_kafka/***/…``, found by an outside
    tester)."""
    out: list[str] = []
    message: list[str] = []
    code = False  # in the lines of code that follow a frame's line
    for line in text.splitlines(keepends=True):
        bare = line.rstrip("\n")
        code = bool(_FRAME.match(bare) and "File" in bare) or (code and bare.startswith("    "))
        if code or _FRAME.match(bare):
            out.append(redact("".join(message)))
            message = []
            out.append(line)
        else:
            message.append(line)
    out.append(redact("".join(message)))
    return "".join(out)


def credential(key: str) -> bool:
    """Whether a config key names a credential (``sasl.password``, ``client.secret``)."""
    return _CREDENTIAL_KEY.search(key) is not None


def _holds_secret(value: str) -> bool:
    """Whether a string of a config holds a secret by its shape: user info with a password, or
    a NATS URL's lone user info (a token)."""
    return bool(USERINFO_VALUE.search(value) or NATS_TOKEN_VALUE.match(value))


def secrets_of(value: Any) -> list[str]:
    """The secrets a config (or any part of it) holds: its ``SecretStr`` values, the strings
    under credential keys, and its other strings that hold user info (a ':' before an '@':
    a URL's password, also in a URL too broken to parse, with quotes or spaces in it; a NATS
    URL's lone user info, a token)."""
    if isinstance(value, SecretStr):
        return [value.get_secret_value()]
    if isinstance(value, str):
        return [value] if _holds_secret(value) else []
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
        return [] if _holds_secret(value) else [value]
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
    (redacted whole first: a secret may span lines); Weir's own (:func:`own`) by shape, and
    its line is Weir's own too (a :class:`Said`: a message that quotes it keeps its words)."""
    text = own(e)
    whole = redact(str(e)) if text is None else redact_urls(text)
    lines = [line.strip() for line in whole.splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    return lines[0] if text is None else Said(lines[0])


def shaped_mask(value: str) -> bool:
    """Whether ``value`` holds a mask where a rule by shape puts one."""
    return (
        f":{MASK}@" in value
        or any(m.group("token") == MASK for m in _NATS_TOKEN.finditer(value))
        or any(m.group(2) == MASK for m in _KEY_VALUE.finditer(value))
    )
