"""Redaction (core/redact.py): passwords in URLs, secrets the config holds, log records."""

from __future__ import annotations

import logging
import re

from pydantic import SecretStr

from core.config.model import WeirConfig
from core.redact import RedactingFormatter, Secrets, raw_secrets, redact_urls, secrets_of


def test_url_passwords_are_masked_also_in_malformed_urls() -> None:
    cases = {
        "nats://u:s3cret@host:4222": "nats://u:***@host:4222",
        "nats:/u:s3cret@host:4222": "nats:/u:***@host:4222",
        "nast://u:s3cret@host:4222": "nast://u:***@host:4222",
        "postgresql://weir:pa%ss@127.0.0.1:5432/app": "postgresql://weir:***@127.0.0.1:5432/app",
        "postgresql://weir:p@ss@h/db": "postgresql://weir:***@h/db",
        "redis://:tok3n@h": "redis://:***@h",
        "url 'https://a:b1@x/y' and 'nats://c:d2@z'": "url 'https://a:***@x/y' and 'nats://c:***@z'",
        "host=h password=s3cret user=u": "host=h password=*** user=u",
        "sasl.password='two words' x": "sasl.password=*** x",
    }
    none = Secrets()  # none remembered: the URL rules alone
    for text, want in cases.items():
        assert none.redact(text) == want, text
    for text in ("http://127.0.0.1:8080/x", 'connection to server at "h", port 5 failed'):
        assert none.redact(text) == text


def test_remembered_secrets_are_masked_in_every_spelling() -> None:
    secret = 'Zq-canary-%-"x'
    secrets = Secrets()
    secrets.remember([secret, "postgresql://weir:Zq-pw-%25-y@db/app", "abc"])
    for form in (secret, "Zq-canary-%25-%22x", 'Zq-canary-%-\\"x', "Zq-pw-%25-y", "Zq-pw-%-y"):
        assert secrets.redact(f"error: {form}!") == "error: ***!", form
    assert secrets.redact("abc weir") == "abc weir"  # too short to be searched for everywhere


def test_secrets_of_a_config_and_of_a_file_with_mistakes() -> None:
    cfg = WeirConfig.model_validate({
        "api": {"tokens": ["tok-0123456789abcdef"]},
        "sources": [{"name": "a", "kind": "postgres", "url": "postgresql://u:pw1x@h/d",
                     "tables": ["public.t"]}],
        "connectors": [{"name": "n", "type": "nats", "stream": "events",
                        "nats": {"url": "nats://u:pw2x@h:4222"}},
                       {"name": "w", "type": "webhook", "stream": "events",
                        "webhook": {"url": "https://h/x", "headers": {"X-Key": "pw3x"}}}],
    })  # fmt: skip
    assert set(secrets_of(cfg)) == {
        "tok-0123456789abcdef", "postgresql://u:pw1x@h/d", "pw2x", "pw3x"
    }  # fmt: skip
    assert secrets_of(SecretStr("s")) == ["s"]
    raw = {"store": {"url": "postgresql://u:pw4x@h/d"}, "api": {"tokens": ["tok5x", 3]},
           "connectors": [{"nats": {"url": "nats://h:1", "password": "pw6x"}}]}  # fmt: skip
    assert set(raw_secrets(raw, WeirConfig)) == {"pw4x", "tok5x", "pw6x"}


def test_log_records_are_redacted_and_tracebacks_only_when_asked() -> None:
    try:
        raise ValueError("cannot connect to nats://u:s3cret@h:1")
    except ValueError as e:
        record = logging.LogRecord("weir", logging.ERROR, __file__, 1, "failed: %s", (e,),
                                   exc_info=(type(e), e, e.__traceback__))  # fmt: skip
    fmt = "%(levelname)s %(message)s"
    short = RedactingFormatter(fmt, tracebacks=False).format(record)
    assert short == (
        "ERROR failed: cannot connect to nats://u:***@h:1\n"
        "ValueError: cannot connect to nats://u:***@h:1"
    )
    record.exc_text = None  # formatted anew
    full = RedactingFormatter(fmt, tracebacks=True).format(record)
    assert "Traceback (most recent call last)" in full and "s3cret" not in full


def test_pieces_of_a_password_split_at_its_at_and_colon_are_hidden() -> None:
    """A URL parser reads an unencoded '@' or ':' in a password as the end of the user info
    or a port, and its errors then name pieces of the password as a host."""
    s = Secrets()
    s.remember(["postgresql://weir:Zq9@SECRETpw:Hunter2@127.0.0.1:5432/app"])
    said = "cannot reach SECRETpw:Hunter2@127.0.0.1: failed to resolve host 'SECRETpw'"
    assert "SECRET" not in s.redact(said) and "Hunter2" not in s.redact(said)


def test_pieces_of_a_password_split_at_a_slash_or_question_mark_are_hidden() -> None:
    s = Secrets()
    s.remember(["postgresql://weir:Abcd/Efgh?Ijkl@127.0.0.1:5432/app"])
    said = 'invalid integer value "Abcd" for connection option "port"; path Efgh?Ijkl@127'
    assert not {"Abcd", "Efgh", "Ijkl"} & set(re.findall(r"\w+", s.redact(said)))


def test_pieces_of_a_password_given_alone_are_hidden() -> None:
    """secrets_of gives a URL's password alone: its pieces are hidden as well."""
    s = Secrets()
    s.remember(secrets_of("nats://bob:S3cr3t/pa?ss#w0rd@127.0.0.1:4222"))
    assert s.redact("Port could not be cast to integer value as 'S3cr3t'").endswith("'***'")
    s.remember(["postgresql://weir@127.0.0.1/app"])  # no password: its parts are no secret
    assert s.redact("user weir on app") == "user weir on app"


def test_key_and_signature_query_parameters_are_hidden() -> None:
    """A webhook URL may carry its credential as a query parameter of any of these names."""
    got = redact_urls("POST http://h:1/hook?api_key=K1secret&X-Amz-Signature=S1g&token=T0k 302")
    assert got == "POST http://h:1/hook?api_key=***&X-Amz-Signature=***&token=*** 302"
