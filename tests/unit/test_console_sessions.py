"""Console sessions (core/api/console/sessions.py): tokens, idle expiry, CSRF."""

from __future__ import annotations

import time

from core.api.console.sessions import Sessions, csrf_ok


def test_only_an_api_token_is_valid() -> None:
    sessions = Sessions([b"alpha-token", b"beta-token"])
    assert sessions.valid_token("beta-token")
    assert not sessions.valid_token("")
    assert not sessions.valid_token("beta-toke")
    assert not sessions.valid_token("alpha-token ")


def test_a_session_lives_while_used_and_ends_when_idle_or_closed() -> None:
    sessions = Sessions([b"t"], idle=0.3)
    sid, session = sessions.open()
    assert sessions.get(sid) is session
    assert sessions.get(sid + "x") is None and sessions.get(None) is None
    for _ in range(3):  # each use starts the idle time again
        time.sleep(0.15)
        assert sessions.get(sid) is session
    time.sleep(0.35)
    assert sessions.get(sid) is None
    sid, _ = sessions.open()
    sessions.close(sid)
    assert sessions.get(sid) is None


def test_csrf_tokens_are_per_session() -> None:
    sessions = Sessions([b"t"])
    (_, a), (_, b) = sessions.open(), sessions.open()
    assert a.csrf != b.csrf
    assert csrf_ok(a, a.csrf)
    assert not csrf_ok(a, b.csrf) and not csrf_ok(a, "")
