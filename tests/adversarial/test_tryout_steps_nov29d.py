"""Findings of a fourth Nov 29 outside try-out of steps (docs/transforms.md), against real
servers (PostgreSQL, the HTTP pull API). Each test is one promise of docs/transforms.md the
try-out found broken on the current code; its docstring quotes the promise and tells what was
seen. (The findings of test_tryout_steps_nov29.py, …nov29b.py and …nov29c.py are not
repeated.)

Most are about the new rule for numbers in expressions (core/steps/numbers.py, “Expressions”:
“whole numbers stay whole numbers (of any size); any other is computed in decimal digits,
exactly … `/` to 34 significant digits, `//` rounding down; a literal is taken as written”),
seen through an HTTP pull consumer's filter."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.adversarial.test_tryout_steps_nov29c import ONLY_J, _insert_j, _jtable, _kept
from tests.helpers import stored
from tests.helpers.api import all_handled, api_serving, receive
from tests.helpers.capture import wait_for
from tests.helpers.cli import weir
from tests.helpers.functions import write_module
from tests.helpers.weir import serving, weir_config

# -- Numbers: exactness -----------------------------------------------------------------------


def test_a_sum_beyond_a_hundred_thousand_digits_is_silently_rounded(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “any other is computed in decimal digits, exactly
    (`0.1 + 0.2 == 0.3`, …) … a literal is taken as written (`1e-400 > 0`)”. ``filter: '1 +
    1e-100000 > 1'`` and ``filter: '1e100000 + 1 > 1e100000'`` are both FALSE (every row
    dropped, nothing on the failed list): the sum is computed in a 100,000-digit context that
    rounds without a word (Inexact is not trapped), so ``1 + 1e-100000`` is 1. The same with a
    json column ``{"x": 1e-100000}`` and ``record.doc.x + 1 > 1``. (A ``//`` past that many
    digits fails its message, saying so; ``+``, ``-`` and ``*`` round.) Now a result of more
    than 4,300 digits (the documented bound) fails its message, saying so, never rounded."""
    kept = _kept(db_url, {"small": "1 + 1e-100000 > 1",
                          "big": "1e100000 + 1 > 1e100000",
                          "field": "record.doc.x + 1 > 1"},
                 (1, '{"x": 1e-100000}'), kind="json")  # fmt: skip
    why = "steps[0] filter: ArithmeticError: +: the result has more than 4300 digits"
    assert all(len(v) == 1 and why in str(v[0]) for v in kept.values()), kept


def test_float_nan_and_infinity_fail_with_an_unreadable_or_wrong_reason(db_url: str) -> None:
    """docs/transforms.md “What steps keep”: a message its steps cannot make goes to the failed
    list, and “The error names the step and gives the error's first line”; “Expressions” lists
    `float` among the calls and computes numbers “in decimal digits … (a float by its shortest
    digits)”. ``filter: 'float(record.doc.s) < 1'`` over ``{"s": "nan"}`` fails with
    ``StepFailed: steps[0] filter: InvalidOperation: [<class 'decimal.InvalidOperation'>]``
    (Python's own repr of a Decimal signal, saying nothing), and ``filter:
    'float(record.doc.t) - float(record.doc.t) == 0'`` over ``{"t": "inf"}`` fails with
    ``-: the result has more than 100000 digits``, a reason that is not true (inf - inf is no
    number at all)."""
    kept = _kept(db_url, {"nan": "float(record.doc.s) < 1",
                          "inf": "float(record.doc.t) - float(record.doc.t) == 0"},
                 (1, '{"s": "nan", "t": "inf"}'))  # fmt: skip
    errors = [e for v in kept.values() for e in v if isinstance(e, str)]
    assert len(errors) == 2, kept
    assert not [e for e in errors if "<class" in e or "more than 100000 digits" in e], kept


def test_a_product_of_whole_numbers_takes_seconds_a_message(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “whole numbers stay whole numbers (of any size)”, while
    any other number is computed within bounds (a result of more than 100,000 digits fails its
    message: core/steps/numbers.py), and “Cost”: “a message is read as JSON once, runs every
    step and is written once”. ``filter: 'int(9e4299) * int(9e4299) * … > 0'`` (280 factors,
    3,919 characters, under the 4,096 allowed) takes about 3 s for EACH message (a
    1.2-million-digit int, unbounded): the receive that runs it hangs that long. The same product
    in decimals (``9e4299 * 9e4299 * …``) fails its message at once."""
    expr = " * ".join(["int(9e4299)"] * 280) + " > 0"
    _jtable(db_url)
    cs = [{"name": "slow", "stream": "events", "filters": ONLY_J, "steps": [{"filter": expr}]}]
    with api_serving(db_url, consumers=cs) as client:
        _insert_j(db_url, (1, "{}"))
        time.sleep(1)  # the captured row reaches the queue
        took = []
        got: list[Any] = []
        for _ in range(20):
            t = time.monotonic()
            got.extend(receive(client, "slow"))
            took.append(time.monotonic() - t)
            if got:
                break
        failed = client.get("/v1/http-consumers/slow/failed").json()["data"]
    assert got or failed, "the message was neither received nor failed"
    assert max(took) < 1.0, f"a receive of one message took {max(took):.1f} s"


def test_str_of_a_whole_number_of_over_4300_digits_fails_with_a_type_name(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “whole numbers stay whole numbers (of any size)” and
    `str` gives “a number as JSON writes it”. ``filter: 'str(record.doc.a * … * record.doc.a)
    != ""'`` (15 factors) over a jsonb ``{"a": 999…9}`` (300 nines, within a double's range so
    read as a number) fails its message with ``TypeError: Type is not JSON serializable: Big``:
    the product has 4,500 digits, past Python's 4,300-digit limit for an int written as text,
    and the error names an internal class. (``str(int(9e4299) * int(9e4299))`` alike.)"""
    product = " * ".join(["record.doc.a"] * 15)
    kept = _kept(db_url, {"str": f'str({product}) != ""'},
                 (1, '{"a": %s}' % ("9" * 300)))  # fmt: skip
    assert len(kept["str"]) == 1 and "*: the result has more than 4300 digits" in str(
        kept["str"][0]), kept  # the documented bound, said: not a type name  # fmt: skip


# -- Functions' outputs ------------------------------------------------------------------------


def test_a_function_returning_a_datetime_or_uuid_is_sent_as_text(
    db_url: str, functions_dir: Path
) -> None:
    """docs/transforms.md “Functions”: “The values are JSON's: dicts, lists, text, numbers,
    `True`, `False`, `None` … What JSON cannot hold (a `Decimal('NaN')`, a set, bytes, a key
    that is not text) fails the message”. A function returning ``record`` with
    ``datetime.datetime(2026, 1, 2, 3, 4, 5)``, ``uuid.UUID(…)`` or a ``dataclass`` in it — none
    a JSON value — has its message SENT, each turned into what orjson makes of it (the text
    ``"2026-01-02T03:04:05"``, the uuid's text, an object of the dataclass's fields), while a
    set in the same place fails the message (as promised). What the subscriber gets hangs on
    orjson's extensions, not on JSON's values. The docs now say what each becomes (orjson's
    writing is kept: a datetime as ISO text is what a receiver wants); a set still fails."""
    write_module(functions_dir / "f.py",
                 "import dataclasses, datetime, uuid\n"
                 "@dataclasses.dataclass\n"
                 "class P:\n"
                 "    x: int\n"
                 "def when(action, record, changes, metadata):\n"
                 "    return {'record': {**record, 'at': datetime.datetime(2026, 1, 2, 3, 4, 5)}}\n"
                 "def uid(action, record, changes, metadata):\n"
                 "    return {'record': {**record, 'u': uuid.UUID(int=1)}}\n"
                 "def dc(action, record, changes, metadata):\n"
                 "    return {'record': {**record, 'p': P(1)}}\n"
                 "def aset(action, record, changes, metadata):\n"
                 "    return {'record': {**record, 's': {1}}}\n")  # fmt: skip
    names = ("when", "uid", "dc", "aset")
    cs = [{"name": n, "stream": "events", "filters": ONLY_J,
           "steps": [{"transform": {"function": f"f:{n}"}}]} for n in names]  # fmt: skip
    _jtable(db_url)
    with api_serving(db_url, consumers=cs, functions={"dir": str(functions_dir)}) as client:
        _insert_j(db_url, (1, "{}"))
        seen = {n: all_handled(client, n) for n in names}
    sent = {n: [m["record"]["data"] for m in got] for n, (got, _) in seen.items()}
    failed = {n: [f.get("error") for f in bad] for n, (_, bad) in seen.items()}
    assert [s["at"] for s in sent["when"]] == ["2026-01-02T03:04:05"], sent
    assert [s["u"] for s in sent["uid"]] == ["00000000-0000-0000-0000-000000000001"], sent
    assert [s["p"] for s in sent["dc"]] == [{"x": 1}], sent
    assert not sent["aset"] and "steps[0] transform" in failed["aset"][0], (sent, failed)
    assert not failed["when"] and not failed["uid"] and not failed["dc"], failed


def test_a_route_function_returning_an_ordered_dict_fails_its_message(
    db_url: str, tmp_path: Path
) -> None:
    """docs/transforms.md “Route”: “`route: {function: "module:function"}` returns a dict of
    route fields instead (taken as written, and refused if it is not one)”; the transform
    function's output takes “an OrderedDict's or a defaultdict's” fields (core/steps/compile.py).
    A NATS connector whose route function returns ``collections.OrderedDict(subject="a")`` — a
    dict — has each message FAIL in ``weir transform test``: ``r:sub returned OrderedDict, not a
    dict of route fields`` (the check is ``type(out) is not dict``)."""
    _jtable(db_url)
    with serving(weir_config(db_url, [])):
        _insert_j(db_url, (1, "{}"))
        wait_for(lambda: len(stored.events(db_url)) >= 1, what="the row stored")
    fns = tmp_path / "functions"
    fns.mkdir()
    write_module(fns / "r.py", "import collections\n"
                 "def sub(action, record, changes, metadata):\n"
                 "    return collections.OrderedDict(subject='a')\n")  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({
        "functions": {"dir": "functions"},
        "sources": [{"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}],
        "connectors": [{"name": "c", "type": "nats", "stream": "events",
                        "collections": ["public:j"],
                        "steps": [{"route": {"function": "r:sub"}}]}],
    }))  # fmt: skip
    out = weir("transform", "test", "--config", str(config), "--connector", "c")
    assert "1 messages: 1 sent, 0 dropped, 0 failed" in out, out


def test_len_of_a_number_fails_naming_an_internal_class(db_url: str) -> None:
    """docs/transforms.md “What steps keep”: a message its steps cannot make goes to the failed
    list, and “The error names the step and gives the error's first line”; the other calls say
    what they take (``lower takes text, not a number``, ``int takes numbers, not text``).
    ``filter: 'len(record.doc.a) > 0'`` over a jsonb ``{"a": 1.10}`` fails with ``TypeError:
    object of type 'Exact' has no len()`` — Weir's internal class for an exactly-read number
    (``core.steps.payload.Exact``); over ``{"a": 1.5}`` the same filter says ``'float'``, and
    ``len(record.doc.a + 1)`` says ``'decimal.Decimal'``: the user's number is named by
    whichever way Weir happened to read or compute it."""
    kept = _kept(db_url, {"len": "len(record.doc.a) > 0"}, (1, '{"a": 1.10}'))
    assert len(kept["len"]) == 1 and "Exact" not in kept["len"][0], kept


# -- Config error locations ----------------------------------------------------------------------


def test_the_api_loc_of_a_start_position_error_repeats_its_tag(db_url: str) -> None:
    """docs/operations.md: ``POST /v1/connectors`` … “validated by the same models as the file
    (422 names the field)”, and ``weir config validate`` names it
    ``connectors[0].start_position.seq``. A connector body with ``start_position: {seq: 0}``
    is refused with ``loc: [body, start_position, seq, seq]`` (and ``{time: "garbage"}`` with
    ``[body, start_position, time, time]``): the start position's union tag is left in, a
    path that is in no request. (Steps' tags and the connector's ``type`` tag are taken out.)"""
    with api_serving(db_url) as client:
        locs = []
        for start in ({"seq": 0}, {"time": "garbage"}):
            r = client.post("/v1/connectors", json={"name": "c", "type": "nats",
                                                    "stream": "events",
                                                    "start_position": start})  # fmt: skip
            assert r.status_code == 422, r.text
            locs.append(r.json()["detail"][0]["loc"])
    assert locs == [["body", "start_position", "seq"], ["body", "start_position", "time"]], locs


def test_a_route_template_that_does_not_parse_is_not_placed_at_its_field(
    db_url: str, tmp_path: Path
) -> None:
    """docs/transforms.md: “``weir config validate`` checks every expression, template and
    function at load (``file:line: connectors[0].steps[1]…: why``, exit 2), and the management
    API answers 422 with the same sentence”; a route's other refusals name the field
    (``connectors[0].steps[0].route.subject``, 422 ``[body, steps, 0, route, subject]``, as
    core/config/steps.py promises: “the config's error names its line
    (``connectors[0].steps[1].route.subject``), the API's 422 its key”). A NATS connector's
    ``route: {subject: "a.{record.id"}`` (a lone brace) is placed at ``steps[0].route`` in
    both — the ``subject`` key dropped (likewise a webhook's ``path``, and an ``add``'s
    template is placed at ``transform.add``, not ``transform.add.x``)."""
    body = {"name": "c", "type": "nats", "stream": "events",
            "steps": [{"route": {"subject": "a.{record.id"}}]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({
        "sources": [{"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}],
        "connectors": [body]}))  # fmt: skip
    out = weir("config", "validate", "--config", str(config), code=2)
    with api_serving(db_url) as client:
        r = client.post("/v1/connectors", json=body)
    assert r.status_code == 422, r.text
    assert "connectors[0].steps[0].route.subject:" in out, out
    assert r.json()["detail"][0]["loc"] == ["body", "steps", 0, "route", "subject"], r.text
