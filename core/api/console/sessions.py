"""Console sessions: an API token, given once to the login form, becomes a random session id
held in an HttpOnly, SameSite=Strict cookie, so the token never rides on every request and no
page needs it. Sessions live in the API process's memory (a restart logs everyone out), each
with a CSRF token that every action (a POST) must carry.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

IDLE = 12 * 3600  # seconds a session lives unused
MAX_SESSIONS = 1000  # the oldest go first; only a valid token makes one


@dataclass
class Session:
    csrf: str
    last_used: float
    flash: str | None = None  # what the last action did, shown once by the next page


def _key(sid: str) -> bytes:
    """Sessions are looked up by a digest of their id, so the lookup's timing tells nothing
    about the ids themselves."""
    return hashlib.sha256(sid.encode()).digest()


class Sessions:
    def __init__(self, tokens: list[bytes], idle: float = IDLE) -> None:
        self.tokens = tokens
        self.idle = idle
        self._by_key: dict[bytes, Session] = {}

    def valid_token(self, given: str) -> bool:
        """Whether ``given`` is one of the API tokens (:func:`token_ok`)."""
        return token_ok(given.encode(), self.tokens)

    def open(self) -> tuple[str, Session]:
        """A new session: (its id for the cookie, the session)."""
        now = time.monotonic()
        self._by_key = {k: s for k, s in self._by_key.items() if now - s.last_used < self.idle}
        while len(self._by_key) >= MAX_SESSIONS:
            del self._by_key[min(self._by_key, key=lambda k: self._by_key[k].last_used)]
        sid = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(32), now)
        self._by_key[_key(sid)] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session of ``sid`` (its idle time starts again), or None."""
        if not sid:
            return None
        session = self._by_key.get(_key(sid))
        now = time.monotonic()
        if session is None or now - session.last_used >= self.idle:
            return None
        session.last_used = now
        return session

    def close(self, sid: str) -> None:
        self._by_key.pop(_key(sid), None)


def token_ok(given: bytes, tokens: list[bytes]) -> bool:
    """Whether ``given`` is one of ``tokens``, the bearer tokens of the API and the console's
    login alike: every one is compared, each in constant time."""
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given, token)
    return ok


def csrf_ok(session: Session, given: str) -> bool:
    return hmac.compare_digest(session.csrf.encode(), given.encode())
