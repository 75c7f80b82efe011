"""The spellings of a remembered secret (core/redact.py's "by value" rule): every way a message
may write it, and the pattern that finds one whole. One place decides them for every secret.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
from urllib.parse import quote, quote_plus, unquote, unquote_plus

MASK = "***"
MAX_CUTS = 8  # delimiters in a password beyond which its pieces are not all paired (a body's
# text, not a password: all pairs of thousands of cuts stalled the API for minutes)
MIN_PIECE = 4  # shorter pieces of a secret (its lines, a password's parts) match too many words
LONG_LINE = 8  # a line of a secret this long is masked alone even when it is a word; a form this
# long and more than letters is masked also where it runs into a word, and in any case

# The same as a URL's user info in a whole value (a config field), where quotes and spaces are
# the password's own, and it may start with a '/' (not with '//': that is a scheme's,
# ``nats://u:p@h``).
USERINFO_VALUE = re.compile(r"^(?P<head>[^@]*?:)(?P<password>(?!//).*)@", re.S)
# A NATS URL whose user info is one part: nats-py sends it as a token (``nats://TOKEN@host``).
NATS_TOKEN_VALUE = re.compile(r"(?i)^\s*(?:nats|tls|wss?)://(?P<token>[^\s:/@]+)@")
# An HTTP credential (an ``Authorization`` header's value): a scheme, then the credentials, which
# a server may echo alone (``{"error": "invalid token", "token": "..."}``).
_AUTH_SCHEME = re.compile(
    r"(?i)^\s*(?P<scheme>bearer|basic|token|digest|bot|negotiate|api-?key|key|jwt|oauth|splunk"
    r"|sso-key)\s+(?P<credentials>\S.*?)\s*$",
    re.S,
)


def _telling(line: str) -> bool:
    """Whether a line of a secret is one to mask alone: long, or more than a word (a word such
    as ``line`` is Weir's own too: its 422 for the header value ``line\n...`` read 'a ***
    break no header can carry')."""
    return len(line) >= LONG_LINE or (len(line) >= MIN_PIECE and not line.isalpha())


def _spellings(value: str) -> set[str]:
    """The ways ``value`` may be written in a message: escaped (JSON, also with ``\\/`` as
    PHP writes it and ``\\u003c`` for ``<``, ``>`` and ``&`` as Go does; repr; HTML's entities),
    percent-encoded (every character, or keeping ``/`` as ``urllib.parse.quote`` does, or with
    ``+`` for spaces) or -decoded, trimmed, its lines."""
    variants = {value, value.strip(), " ".join(value.split())}
    variants |= {line.strip() for line in value.splitlines() if _telling(line.strip())}
    out = set()
    for v in variants | {unquote(v) for v in variants} | {unquote_plus(v) for v in variants}:
        escaped = {json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1]}
        out |= {v, quote(v, safe=""), quote(v), quote_plus(v), quote_plus(v, safe="/")}
        out |= escaped | {e.replace("/", "\\/") for e in escaped} | {_go(e) for e in escaped}
        out |= _quoted(v) | _html(v)
    return {s for s in out if s.strip()}


def _go(escaped: str) -> str:
    """JSON-escaped text as Go's encoding/json writes it (HTML's characters escaped)."""
    return escaped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _html(v: str) -> set[str]:
    """``v`` in HTML or XML (an error page's): its ``& < >`` and quotes as entities, named or
    numbered (Python's, Go's, PHP's, XML's)."""
    named = html.escape(v)
    quotes = (("&#39;", "&#34;"), ("&#039;", "&quot;"), ("&apos;", "&quot;"))  # PHP's, XML's
    return {named, html.escape(v, quote=False)} | {
        named.replace("&#x27;", single).replace("&quot;", double) for single, double in quotes
    }


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


def _basic(credentials: str) -> set[str]:
    """Of ``Basic <base64>``'s credentials, what a receiver that decodes them may echo: the
    ``user:password`` and the password alone (when it is no shorter than MIN_PIECE)."""
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return set()
    _, colon, password = decoded.partition(":")
    out = _spellings(decoded) if decoded.strip() else set()
    if colon and len(password.strip()) >= MIN_PIECE:
        out |= _spellings(password)
    return out


def forms(value: str) -> set[str]:
    """What to search for of a secret value: the value itself unless it is a whole URL (its
    host is no secret), and of the user info it holds, the password, its pieces and the
    ``Authorization: Basic`` that an HTTP client makes of it; of a NATS URL's lone user info,
    the token; of an HTTP credential (``Bearer tok``), the credentials alone too, and what
    Basic's base64 decodes to."""
    m = USERINFO_VALUE.search(value)
    out = set() if "://" in value and m else _spellings(value)
    if auth := _AUTH_SCHEME.match(value):  # the credentials are a secret whole, as the value
        out |= _spellings(auth.group("credentials"))
        if auth.group("scheme").lower() == "basic":
            out |= _basic(auth.group("credentials"))
    if m and m.group("password"):
        user, password = m.group("head")[:-1].rsplit("/", 1)[-1], m.group("password")
        out |= _spellings(password) | {s for p in _pieces(password) for s in _spellings(p)}
        out.add(base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode())
    elif token := NATS_TOKEN_VALUE.match(value):
        out = _spellings(token.group("token"))  # the URL's host is no secret
    return out


def caseless(form: str) -> bool:
    """Whether ``form`` is found in any case (an echo lower- or upper-cased): when no word
    could be it, LONG_LINE characters or more and more than letters."""
    return len(form) >= LONG_LINE and not form.isalpha()


def whole(form: str) -> str:
    """A pattern for ``form`` where it does not run on into a word: ``secret`` is not masked
    in ``secretnats``. A form no word of others' text is (:func:`caseless`) is masked where it
    runs into one too, and in any case: a receiver's ``xxx…Zq8-Hidden-Token`` showed it (found
    by an outside tryout), another ``bearer mixedcasetok99``."""
    if caseless(form):
        return f"(?i:{re.escape(form)})"
    left = r"(?<!\w)" if re.match(r"\w", form[0]) else ""
    right = r"(?!\w)" if re.match(r"\w", form[-1]) else ""
    return left + re.escape(form) + right
