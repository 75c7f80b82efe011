"""Weir's own sentences keep their words (core/redact.py ``said``): an error Weir raises is
built with said(), so a password that is an ordinary word (the compose file's ``weir``) masks
only the values the sentence carries, never the sentence (``schema *** yet: `*** run```)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from connectors.nats.config import check_subject_tail
from core.config.base import check_http_url
from core.config.load import ConfigError, load_config
from core.failures import Unreachable
from core.logs import RedactingFormatter
from core.redact import Secrets, first_line, remember
from core.sources.pg.slot import unreadable
from core.store.upgrade import none_earlier_runs

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("core", "connectors")  # spark/ is another engineer's, devkit/ and bench/ are tools
# Messages still built from values outside said(), each as "path:line" with why. Empty: every
# site is converted; a site may be listed here only with a reason, and the report names it.
ALLOWED: dict[str, str] = {}


def _built(node: ast.expr) -> bool:
    """Whether ``node`` is a text made of values: an f-string with a field, ``"...".format()``,
    ``"..." % ...``, or a ``+`` of such."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        text = isinstance(node.func.value, (ast.Constant, ast.JoinedStr))
        return node.func.attr == "format" and text
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return isinstance(node.left, (ast.Constant, ast.JoinedStr))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _built(node.left) or _built(node.right)
    return False


def _made_error(call: ast.Call, raised: bool) -> bool:
    """Whether ``call`` makes an error: any call a ``raise`` raises, ``super().__init__`` in an
    error's class, or a call of a class named as errors are (``...Error``, ``StepFailed``)."""
    func = call.func
    name = (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )
    return raised or name == "__init__" or name.endswith(("Error", "Exception", "Failed"))


def unsaid_messages() -> list[str]:
    """Where an error's message is built from values without said(): ``path:line``."""
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            raised = {id(n.exc) for n in ast.walk(tree) if isinstance(n, ast.Raise)}
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not _made_error(node, id(node) in raised):
                    continue
                args = [*node.args, *(k.value for k in node.keywords)]
                if any(_built(a) for a in args):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_error_message_of_weirs_is_said() -> None:
    """An error's message built from values goes through said() (its words Weir's own, each
    value masked on its own); a plain constant text is fine. A new ``raise X(f"...{v}...")``
    fails here, named by file and line."""
    found = [where for where in unsaid_messages() if where not in ALLOWED]
    assert not found, "build these messages with core.redact.said(): " + ", ".join(found)


def test_the_guard_sees_each_way_of_building_a_message(tmp_path: Path) -> None:
    """The guard's test of a message: an f-string, format() and % are caught, said() and a
    plain text are not."""
    code = {
        'raise ValueError(f"no source {name}")': True,
        'raise ValueError("no source {}".format(name))': True,
        'raise ValueError("no source %s" % name)': True,
        'raise ValueError("no " + f"source {name}")': True,
        'raise ValueError(said("no source %s", name))': False,
        'raise ValueError("no source")': False,
        'super().__init__(f"no source {name}")': True,
        'return StepFailed(f"{name}: failed")': True,
    }
    for line, caught in code.items():
        tree = ast.parse(line if line.startswith(("raise", "super")) else f"def f():\n {line}")
        raised = {id(n.exc) for n in ast.walk(tree) if isinstance(n, ast.Raise)}
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and _made_error(n, id(n) in raised)]  # fmt: skip
        assert any(_built(a) for c in calls for a in c.args) is caught, line


@pytest.fixture
def own_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """What this test remembers stays in it (the process's secrets mask every test's output)."""
    monkeypatch.setattr("core.redact._SECRETS", Secrets())


def _logged(e: BaseException) -> str:
    record = logging.LogRecord("weir", logging.ERROR, __file__, 1, "failed: %s", (e,), None)
    return RedactingFormatter("%(message)s", tracebacks=False).format(record)


def _raised(fn: Any, *args: Any) -> BaseException:
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


class _Rows:
    """A connection whose one query answers ``row``."""

    def __init__(self, row: tuple[Any, ...]) -> None:
        self.row = row

    def execute(self, *_: Any) -> _Rows:
        return self

    def fetchone(self) -> tuple[Any, ...]:
        return self.row


@pytest.mark.usefixtures("own_secrets")
@pytest.mark.parametrize(
    ("word", "make", "want"),
    [
        (  # capture: the slot cannot be read past a publication dropped
            "slot",
            lambda: _raised(
                unreadable,
                None,
                SimpleNamespace(
                    name="app", slot="app_slot", publication="pub_secret", on_slot_loss="stop"
                ),
                'publication "pub" does not exist',
            ),
            "source 'app': replication slot 'app_slot' cannot be read past a change made while "
            "publication 'pub_secret' did not exist (it was dropped and made anew, or the config "
            "names another one): set on_slot_loss: backfill on the source to make the slot anew "
            "and backfill every table (the events since cannot be recovered)",
        ),
        (  # the store: an earlier version's instances run on it
            "store",
            lambda: _raised(none_earlier_runs, _Rows(("weir-lease secret",)), "cdc"),
            "instances of an earlier Weir run on the store (schema cdc; their lease connections: "
            "***-lease ***): stop every instance of the store, then start this version (its "
            "locks carry the store's schema; docs/operations.md “Upgrading”)",
        ),
        (  # config: a URL refused, the parser's error quoting the password
            "URL",
            lambda: _raised(check_http_url, "ftp://x secret", "https://hooks.example.com/weir"),
            "expected an http:// or https:// URL, like https://hooks.example.com/weir",
        ),
        (  # a connector's: a NATS subject refused, the subject holding the password
            "subject",
            lambda: _raised(check_subject_tail, "orders secret"),
            "'orders ***' is no subject: dot-separated tokens, none empty, without *, > or white "
            "space",
        ),
        (  # a server refused: Weir's words around the server's, which quotes the password
            "reach",
            lambda: Unreachable(
                "NATS",
                "nats://u:secret@h:4222",
                "weir: secret refused",
                "the user and password (or token) in nats.url",
                for_good=True,
            ),
            "cannot reach NATS at nats://u:***@h:4222: ***: *** refused; check the user and "
            "password (or token) in nats.url",
        ),
    ],
)
def test_a_converted_error_keeps_its_words_and_masks_its_values(word: str, make: Any,
                                                                want: str) -> None:  # fmt: skip
    """With passwords that are words (``weir``, ``secret``, and one of the sentence's own),
    the sentence prints as written, by first_line() and in a log line, and a secret inside a
    value (an upstream error, a name) is still masked."""
    remember(["weir", "secret", word])
    e = make()
    assert first_line(e) == want
    assert _logged(e) == f"failed: {want}"


@pytest.mark.usefixtures("own_secrets")
def test_a_config_files_refusal_keeps_a_validators_words(tmp_path: Path) -> None:
    """load_config prints a validator's own sentence (its Said, not pydantic's plain msg):
    with the password ``weir`` the example URL stays ``.../weir`` (it read ``.../***``)."""
    path = tmp_path / "weir.yaml"
    path.write_text(
        "store:\n  url: postgresql://weir:weir@db/weir\n"
        "connectors:\n  - name: hook\n    type: webhook\n    stream: records\n"
        "    webhook:\n      url: 'ftp://weir:weir@x/y'\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "8: connectors[0].webhook.url: expected an http:// or https:// URL, like "
        "https://hooks.example.com/weir"
    ]
