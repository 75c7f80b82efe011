"""Log lines without secrets (core/logs.py): whatever shape a record's arguments take, no secret
survives formatting, and nothing else in the line changes; the config's names and Weir's own
words (a progress line's) are never masked."""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config.model import WeirConfig
from core.logs import RedactingFormatter
from core.progress import Progress
from core.redact import MASK, remember, remember_config


class Thing:
    """An object of a library's with its own str() and repr()."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Thing({self.text!r})"


# How a record may carry a text (``alpha <SECRET> omega``): the message's format and its args.
SHAPES: dict[str, tuple[Callable[[str], Any], Callable[[str], tuple[Any, ...]]]] = {
    "text": (lambda t: "said: %s", lambda t: (t,)),
    "its repr": (lambda t: "said: %r", lambda t: (t,)),
    "its ascii": (lambda t: "said: %a", lambda t: (t,)),
    "bytes": (lambda t: "said: %s", lambda t: (t.encode(),)),
    "a bytearray's repr": (lambda t: "said: %r", lambda t: (bytearray(t.encode()),)),
    "a tuple": (lambda t: "said: %s", lambda t: ((t, 1),)),
    "a list of dicts": (lambda t: "said: %r", lambda t: ([{"k": t}],)),
    "a dict's key": (lambda t: "said: %s", lambda t: ({t: 1},)),  # the record's args: the dict
    "mapping args": (lambda t: "said: %(v)s and %(v)r", lambda t: ({"v": t},)),
    "an error": (lambda t: "said: %s", lambda t: (ValueError(t),)),
    "a KeyError": (lambda t: "said: %s", lambda t: (KeyError(t),)),
    "an OSError of bytes": (lambda t: "said: %s", lambda t: (OSError(2, t.encode()),)),
    "an object": (lambda t: "said: %s %r", lambda t: (Thing(t), Thing(t))),
    "an error as the message": (lambda t: ValueError(t), lambda t: ()),
}
# Secrets with a letter and a digit (no word of the line is one by chance): URL and regex
# specials, quotes, a backslash, a line break, letters no ASCII has and one no font shows;
# never < or >, which mark where the secret is in the line.
ALPHABET = string.ascii_letters + string.digits + "%@:/?#&=+*.^$|()[]{}\\'\"-_~!;, \näé€\u200b"
SECRET = st.text(ALPHABET, min_size=1, max_size=16).filter(
    lambda s: s == s.strip() and bool(re.search("[A-Za-z]", s) and re.search("[0-9]", s))
)


def _record(msg: Any, args: tuple[Any, ...]) -> logging.LogRecord:
    return logging.LogRecord("weir", logging.INFO, __file__, 1, msg, args, None)


@given(secret=SECRET, shape=st.sampled_from(sorted(SHAPES)))
def test_no_secret_survives_whatever_the_arguments_shape(secret: str, shape: str) -> None:
    """A secret inside an argument (a tuple, a dict's key, an error's text, bytes, an object's
    repr; found: only arguments that were a secret whole, or text, were masked) is masked in
    the line as the argument prints it, and the line is the one logging prints but for that:
    the words around it, the quotes and escapes stay as they are."""
    remember([secret])
    msg, args = SHAPES[shape]
    text = f"alpha <{secret}> omega"
    plain = logging.Formatter("%(message)s").format(_record(msg(text), args(text)))
    got = RedactingFormatter("%(message)s", tracebacks=False).format(_record(msg(text), args(text)))
    assert got == re.sub("<[^<>]*>", f"<{MASK}>", plain), (plain, got)


def test_a_format_its_arguments_do_not_fit_prints_them_masked() -> None:
    """logging's own report of a format its arguments do not fit printed them as they are."""
    remember(["Zq8-pw"])
    got = RedactingFormatter("%(message)s", tracebacks=False).format(
        _record("said: %d rows of %s", ("Zq8-pw", ("x", "Zq8-pw")))
    )
    assert "Zq8-pw" not in got and got.startswith("said: %d rows of %s"), got


def test_a_progress_line_keeps_the_tables_name_and_its_own_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A password ``orders`` and a table ``public.orders`` (or a password ``rows``): the
    backfill's progress lines read ``backfill public.*** ... 1,000 ***`` (found by an outside
    tryout), while every other line prints the table, a name of the config, as it is."""
    remember_config(WeirConfig.model_validate({
        "store": {"url": "postgresql://weir:rows@db/store"},
        "sources": [{"name": "app", "kind": "postgres", "tables": ["public.orders"],
                     "url": "postgresql://weir:orders@db/app"}]}))  # fmt: skip
    caplog.set_level(logging.INFO, "weir.progress")
    with Progress("backfill", 1000, name="public.orders", every=0.0) as progress:
        progress.update(500)
        progress.finish("1,000 rows read, 1,000 written")
    formatter = RedactingFormatter("%(message)s", tracebacks=False)
    lines = [formatter.format(r) for r in caplog.records]
    assert lines[0].startswith("backfill public.orders   50%  500/1,000 rows"), lines
    assert lines[-1] == "backfill public.orders: 1,000 rows read, 1,000 written", lines
    assert not any(MASK in line for line in lines), lines


def test_mapping_args_are_each_shown() -> None:
    """``%(name)s`` takes each value of a mapping: a name of the config's as it is."""
    remember_config(WeirConfig.model_validate({"sources": [
        {"name": "orders", "kind": "postgres", "url": "postgresql://u:orders@db/app",
         "tables": ["public.t"]}]}))  # fmt: skip
    args: Mapping[str, Any] = {"source": "orders", "why": "orders refused"}
    got = RedactingFormatter("%(message)s", tracebacks=False).format(
        _record("source %(source)s: %(why)s", (args,))
    )
    assert got == f"source orders: {MASK} refused"


def test_a_kafka_clients_name_is_weirs_own(caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka names the client by its client.id, ``weir-NAME#producer-2``: with the
    password ``weir`` it read ``FAIL [***-kafka-sasl#producer-2]`` (found by an outside
    tester); what librdkafka says is still masked."""
    from connectors.kafka.config import KafkaSettings
    from connectors.kafka.sink import _ClientLog, client_config

    remember(["weir"])
    settings = KafkaSettings.model_validate({"bootstrap_servers": "127.0.0.1:9092"})
    formatter = RedactingFormatter("%(message)s", tracebacks=False)
    for which, logger in (("a", _ClientLog(settings)),
                          ("b", client_config(settings, "kafka-sasl")["logger"])):  # fmt: skip
        with caplog.at_level(logging.INFO, "weir.kafka.client"):
            caplog.clear()
            logger.log(logging.ERROR, "%s [%s] %s", "FAIL", "weir-kafka-sasl#producer-2",
                       f"{which}: refused weir")  # fmt: skip
        got = formatter.format(caplog.records[-1])
        assert got == f"FAIL [weir-kafka-sasl#producer-2] {which}: refused ***", got
