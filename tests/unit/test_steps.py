"""A connector's compiled steps (core/steps/) against a plain reference interpreter written here
from docs/transforms.md: generated expressions, step lists and messages must give the same
message, the same drop or an error in both; expressions that try to escape are refused at load;
exact numbers survive a transform.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from connectors.kafka.config import TOPIC_BAD, KafkaConnector
from connectors.nats.config import NatsConnector
from connectors.webhook.config import WebhookConnector
from core.config.model import ConsumerConfig
from core.engine.sink import BatchError
from core.envelope import Message
from core.ids import encode_token
from core.steps import expr, functions
from core.steps.payload import Exact, dump, load
from core.steps.run import StepFailed, Steps
from core.templates import Template, Unrouted

# -- the reference: each expression as text and as a plain function of the message ----------

Ref = Any  # a function of the message dict


class Err(Exception):
    """The reference's error: the compiled expression must raise too."""


def field(value: Any, key: Any) -> Any:
    if isinstance(value, dict):
        return value.get(key)
    if isinstance(value, list) and isinstance(key, int) and not isinstance(key, bool) \
            and -len(value) <= key < len(value):  # fmt: skip
        return value[key]
    return None


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def value(v: Any) -> Any:
    """A number by the value its digits say (docs/transforms.md “Expressions”): an int as it
    is, a float as the Decimal of its shortest digits."""
    return Decimal(repr(v)) if isinstance(v, float) else v


def eq(a: Any, b: Any) -> bool:
    """JSON's equality: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(value(a) == value(b))


def order(op: str, a: Any, b: Any) -> bool:
    if a is None or b is None:
        return False
    if isinstance(a, bool) != isinstance(b, bool) or isinstance(a, (list, dict)):
        raise Err  # lists and objects do not order (docs/transforms.md “Expressions”)
    try:
        a, b = (value(a), value(b)) if is_num(a) and is_num(b) else (a, b)
        return bool(a < b if op == "<" else a >= b)
    except TypeError:
        raise Err from None


def add(a: Any, b: Any) -> Any:
    if type(a) is type(b) and type(a) in (str, list):
        return a + b
    if not (is_num(a) and is_num(b)):
        raise Err
    return a + b if type(a) is type(b) is int else value(a) + value(b)


PATHS: list[tuple[str, Ref]] = [
    ("action", lambda m: m.get("action")),
    ("record.a", lambda m: field(m.get("record"), "a")),
    ('record["b"]', lambda m: field(m.get("record"), "b")),
    ("record.tags[0]", lambda m: field(field(m.get("record"), "tags"), 0)),
    ("record.nested.x", lambda m: field(field(m.get("record"), "nested"), "x")),
    ("metadata.table_name", lambda m: field(m.get("metadata"), "table_name")),
    ("changes.a", lambda m: field(m.get("changes"), "a")),
]
LITERALS = st.one_of(st.integers(-5, 5), st.sampled_from(["x", "y", "", "insert"]),
                     st.sampled_from([True, False, None]))  # fmt: skip


def literal(v: Any) -> tuple[str, Ref]:
    return (repr(v), lambda m: v)


LEAVES = st.one_of(st.sampled_from(PATHS), LITERALS.map(literal))


def _combine(children: st.SearchStrategy[tuple[str, Ref]]) -> st.SearchStrategy[tuple[str, Ref]]:
    def unary(op: str, kid: tuple[str, Ref]) -> tuple[str, Ref]:
        t, f = kid
        if op == "not":
            return (f"(not {t})", lambda m: not f(m))
        if op == "len":

            def n(m: Any) -> Any:
                v = f(m)
                if not isinstance(v, (str, list, dict)):
                    raise Err
                return len(v)

            return (f"len({t})", n)
        if op == "lower":

            def low(m: Any) -> Any:
                v = f(m)
                if not isinstance(v, str):
                    raise Err
                return v.lower()

            return (f"lower({t})", low)

        def neg(m: Any) -> Any:
            v = f(m)
            if not is_num(v):
                raise Err
            return -value(v)

        return (f"(-{t})", neg)

    def binary(op: str, a: tuple[str, Ref], b: tuple[str, Ref]) -> tuple[str, Ref]:
        (ta, fa), (tb, fb) = a, b
        text = f"({ta} {op} {tb})"
        if op == "and":
            return (text, lambda m: fa(m) and fb(m))
        if op == "or":
            return (text, lambda m: fa(m) or fb(m))
        if op == "==":
            return (text, lambda m: eq(fa(m), fb(m)))
        if op == "!=":
            return (text, lambda m: not eq(fa(m), fb(m)))
        if op in ("<", ">="):
            return (text, lambda m: order(op, fa(m), fb(m)))
        if op == "+":
            return (text, lambda m: add(fa(m), fb(m)))

        def is_in(m: Any) -> Any:  # in a literal list
            a = fa(m)
            return any(eq(a, x) for x in [fb(m), "x"])

        return (f"({ta} in [{tb}, 'x'])", is_in)

    def ifexp(c: tuple[str, Ref], a: tuple[str, Ref], b: tuple[str, Ref]) -> tuple[str, Ref]:
        return (f"({a[0]} if {c[0]} else {b[0]})", lambda m: a[1](m) if c[1](m) else b[1](m))

    return st.one_of(
        st.builds(unary, st.sampled_from(["not", "len", "lower", "-"]), children),
        st.builds(binary, st.sampled_from(["and", "or", "==", "!=", "<", ">=", "+", "in"]),
                  children, children),
        st.builds(ifexp, children, children, children),
    )  # fmt: skip


EXPRESSIONS = st.recursive(LEAVES, _combine, max_leaves=8)
VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "Y", "insert", ""]), st.none(),
                   st.booleans(), st.floats(-2, 2, allow_nan=False), st.lists(st.integers(0, 2),
                   max_size=2))  # fmt: skip
RECORDS = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "a": VALUES, "b": VALUES, "c": VALUES, "tags": st.lists(VALUES, max_size=2),
    "nested": st.fixed_dictionaries({}, optional={"x": VALUES})}))  # fmt: skip
MESSAGES = st.builds(
    lambda action, record, changes: {"record": record, "changes": changes, "action": action,
                                     "metadata": {"table_name": "t", "deleted": False}},
    st.sampled_from(["insert", "update", "delete", None]), RECORDS, RECORDS,
)  # fmt: skip


def outcome(f: Ref, m: Any) -> tuple[str, Any]:
    try:
        return ("ok", f(m))
    except (Err, ZeroDivisionError):
        return ("error", None)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS, MESSAGES)
def test_compiled_expressions_agree_with_the_reference(e: tuple[str, Ref], m: Any) -> None:
    text, ref = e
    compiled = expr.expression(text)
    want = outcome(ref, m)
    try:
        got = ("ok", compiled(m.get("action"), m.get("record"), m.get("changes"),
                              m.get("metadata"), m))  # fmt: skip
    except Exception:
        got = ("error", None)
    assert got == want, text


# -- steps: the reference applies a generated step list in plain Python ----------------------

KEYS = st.sampled_from(["a", "b", "c", "tags"])
TRANSFORMS = st.fixed_dictionaries({}, optional={
    "keep": st.lists(KEYS, max_size=3, unique=True),
    "drop": st.lists(KEYS, max_size=2, unique=True),
    "rename": st.dictionaries(KEYS, st.sampled_from(["A", "B", "a"]), max_size=2),
    "add": st.dictionaries(st.sampled_from(["t", "k", "a"]), st.sampled_from(
        [1, "v", "{metadata.table_name}", "{record.a}", "n-{record.a}"]), max_size=2),
    "flatten": st.booleans(),
}).filter(bool)  # fmt: skip
STEPS = st.lists(st.one_of(
    EXPRESSIONS.map(lambda e: ("filter", e)),
    TRANSFORMS.map(lambda t: ("transform", t)),
    st.sampled_from(["x.{record.a}", "{action}.{metadata.table_name}", "fixed"]).map(
        lambda t: ("route", t)),
), max_size=4).filter(lambda steps: not any(  # nothing declarative after a flatten
    k == "transform" and any(k2 == "transform" and s2.get("flatten") for k2, s2 in steps[:i])
    for i, (k, _) in enumerate(steps)))  # fmt: skip


def text(v: Any) -> str:
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def template(t: str, m: Any, escape: bool) -> Any:
    """The reference template: one field alone keeps its value (unescaped); else text."""
    places = {"{metadata.table_name}": field(m.get("metadata"), "table_name"),
              "{record.a}": field(m.get("record"), "a"), "{action}": m.get("action")}  # fmt: skip
    if not escape and t in places:
        return places[t]
    out = t
    for place, v in places.items():
        if place in out:
            if escape and v is None:
                raise Err
            out = out.replace(place, encode_token(text(v)) if escape else
                              ("" if v is None else text(v)))  # fmt: skip
    return out


def reference(steps: list[tuple[str, Any]], m: Any) -> tuple[str, Any, Any]:
    route: dict[str, str] = {}
    for kind, spec in steps:
        if kind == "filter":
            try:
                if not spec[1](m):
                    return ("dropped", None, None)
            except (Err, ZeroDivisionError):
                return ("failed", None, None)
        elif kind == "route":
            try:
                route["subject"] = template(spec, m, escape=True)
            except Err:
                return ("failed", None, None)
        else:
            for part in ("record", "changes"):
                d = m.get(part)
                if isinstance(d, dict):
                    if "keep" in spec:
                        d = {k: d[k] for k in spec["keep"] if k in d}
                    d = {k: v for k, v in d.items() if k not in spec.get("drop", [])}
                    ren = spec.get("rename", {})  # a renamed field replaces one of its name
                    d = {**{k: v for k, v in d.items() if k not in ren},
                         **{ren[k]: v for k, v in d.items() if k in ren}}  # fmt: skip
                    m[part] = d
            rec = m.get("record")
            if isinstance(rec, dict):
                for k, v in spec.get("add", {}).items():
                    rec[k] = template(v, m, escape=False) if isinstance(v, str) else v
            if spec.get("flatten"):
                m = {**(rec if isinstance(rec, dict) else {}), "_action": m.get("action")}
    return ("sent", m, route or None)


def as_config(steps: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for kind, spec in steps:
        if kind == "filter":
            out.append({"filter": spec[0]})
        elif kind == "route":
            out.append({"route": {"subject": spec}})
        else:
            out.append({"transform": spec})
    return out


def message(m: Any) -> Message:
    return Message("s", "postgres", 1, "public:t", m["action"], "g", "k", orjson.dumps(m))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS, MESSAGES)
def test_compiled_steps_agree_with_the_reference(steps: list[tuple[str, Any]], m: Any) -> None:
    cfg = NatsConnector.model_validate({"name": "n", "type": "nats", "stream": "events",
                                        "steps": as_config(steps)})  # fmt: skip
    compiled = Steps(cfg.steps, NatsConnector.ROUTES, records=False, timeout=1.0)
    got = compiled.one(message(m))
    kind, want, route = reference(steps, orjson.loads(orjson.dumps(m)))
    if kind == "failed":
        assert isinstance(got, StepFailed)
    elif kind == "dropped":
        assert got is None
    else:
        assert isinstance(got, Message), got
        assert orjson.loads(got.payload) == want
        assert got.route == route
        assert (got.key, got.group, got.seq) == ("k", "g", 1)  # never a step's to change


# -- refused at load ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "__import__('os')", "record.__class__", 'record["__dict__"]', "2 ** 100000", "open('x')",
    "lambda: 1", "[x for x in record]", "{1, 2}", "{'a': 1}", "record.a(1)", "os.system",
    "len(record, x=1)", "(yield 1)", "f'{record}'", "record[action]", "a := 1", "~record.a",
    "record.a is 1", "..." , "b'x'", "x" * 5000,
])  # fmt: skip
def test_expressions_that_try_to_escape_are_refused_at_load(text: str) -> None:
    with pytest.raises(expr.ExpressionError):
        expr.expression(text)


def test_an_expression_nested_too_deep_is_refused_not_a_crash() -> None:
    with pytest.raises(expr.ExpressionError):
        expr.expression("(" * 1000 + "1" + ")" * 1000)
    with pytest.raises(expr.ExpressionError):
        expr.expression("-" * 2000 + "1")


def test_text_repetition_cannot_blow_up_memory() -> None:
    f = expr.expression('"a" * 1000000000')
    with pytest.raises(TypeError):
        f(None, None, None, None, None)


# -- exact numbers and the batch ---------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b'{"record":{"n":1.10,"big":123456789012345678901234567890,"f":0.1000000000000000055511}}',
    b'{"record":{"n":1E+400,"m":-0.0}}', b'{"record": {"spaced": 1}}',
])  # fmt: skip
def test_a_transform_keeps_every_number_as_written(raw: bytes) -> None:
    cfg = NatsConnector.model_validate({"name": "n", "type": "nats", "stream": "events",
                                        "steps": [{"transform": {"add": {"k": 1}}}]})  # fmt: skip
    steps = Steps(cfg.steps, NatsConnector.ROUTES, records=False, timeout=1.0)
    m = Message("s", "postgres", 1, "public:t", "insert", "g", "k", raw)
    got = steps.one(m)
    assert isinstance(got, Message)
    body = raw.replace(b" ", b"")
    assert got.payload == body[:-2] + b',"k":1}}'
    n = load(raw)["record"].get("n")
    assert n is None or (
        isinstance(n, Exact) and n.text == raw.split(b":")[2].split(b",")[0].decode()
    )


NUMBER_TEXTS = st.sampled_from([
    "1", "-0", "0", "1.10", "1.5", "-2.25e-3", "1E+400", "1e5", "9.99", "0.1000000000000000055511",
    "123456789012345678901234567890", "18446744073709551615"])  # fmt: skip
SEPARATORS = st.sampled_from([(",", ":"), (", ", ": ")])  # Weir's own, and Postgres' jsonb's


def _object(items: list[tuple[str, str]], sep: tuple[str, str]) -> str:
    return "{" + sep[0].join(orjson.dumps(k).decode() + sep[1] + v for k, v in items) + "}"


def _array(values: list[str], sep: tuple[str, str]) -> str:
    return "[" + sep[0].join(values) + "]"


JSON_TEXTS = st.recursive(
    NUMBER_TEXTS | st.sampled_from(["true", "null"]) | st.text(max_size=8).map(
        lambda t: orjson.dumps(t).decode()),
    lambda inner: st.builds(_object, st.dictionaries(st.text(max_size=4), inner, max_size=4).map(
        lambda d: list(d.items())), SEPARATORS) | st.builds(
        _array, st.lists(inner, max_size=4), SEPARATORS),
    max_leaves=12,
)  # fmt: skip


@given(JSON_TEXTS)
def test_a_payload_is_read_with_every_number_as_written_whatever_its_spaces(text: str) -> None:
    """A json or jsonb column's value is written with spaces (``{"a": 1}``): its numbers are
    kept as written all the same, fast path or not."""
    raw = ('{"record":{"v":' + text + "}}").encode()
    exact = json.loads(raw, parse_float=Exact, parse_int=lambda t: load(t.encode()))
    assert dump(load(raw)) == dump(exact)


DECIMALS = st.builds(lambda m, e: Decimal(m).scaleb(e), st.integers(-(10**25), 10**25),
                     st.integers(-8, 8))  # fmt: skip


@given(DECIMALS, DECIMALS)
def test_numbers_compare_by_the_value_their_digits_say(a: Decimal, b: Decimal) -> None:
    """Whatever digits a json column holds: ``<`` and ``==`` as the numbers written are."""
    record = load(f'{{"record":{{"a":{a},"b":{b}}}}}'.encode())["record"]
    for text, want in (("record.a < record.b", a < b), ("record.a == record.b", a == b)):
        assert expr.expression(text)(None, record, None, None, None) is want, (text, a, b)


@pytest.mark.parametrize(("text", "want"), [
    ("record.x // 2", -4), ("record.x % 2", Decimal("0.9")), ("record.y // 2", -4),
    ("record.y % 2", 1.0), ("record.x + 1 > record.x", True),
])  # fmt: skip
def test_exact_numbers_floor_and_keep_their_value_as_floats_do(text: str, want: Any) -> None:
    """``-7.10`` (read exact: orjson writes ``-7.1``) floors as ``-7.1`` does."""
    record = load(b'{"record":{"x":-7.10,"y":-7.0}}')["record"]
    assert expr.expression(text)(None, record, None, None, None) == want
    with pytest.raises(ZeroDivisionError, match="/ by zero"):
        expr.expression("record.x / 0")(None, record, None, None, None)


def test_a_batch_sends_what_its_steps_keep_and_fails_what_they_cannot_make() -> None:
    cfg = NatsConnector.model_validate({"name": "n", "type": "nats", "stream": "events", "steps": [
        {"filter": "record.n != 2"}, {"route": {"subject": "x.{record.tenant}"}}]})  # fmt: skip
    steps = Steps(cfg.steps, NatsConnector.ROUTES, records=False, timeout=1.0)
    batch = [message({"action": "insert", "record": {"n": n, "tenant": t}})
             for n, t in ((1, "a"), (2, "b"), (3, None), (4, "d"))]  # fmt: skip
    sent: list[Message] = []

    async def write(msgs: Any) -> None:
        sent.extend(msgs)
        raise BatchError({1: RuntimeError("the broker refused d")})

    with pytest.raises(BatchError) as e:
        asyncio.run(steps.write(write, batch))
    assert [m.route for m in sent] == [{"subject": "x.a"}, {"subject": "x.d"}]
    assert sorted(e.value.failed) == [2, 3]  # no tenant: failed; d: the broker's refusal, placed
    assert "steps[1] route" in str(e.value.failed[2])


# -- what an outside tryout broke ---------------------------------------------------------------


def connector_steps(spec: list[dict[str, Any]]) -> Steps:
    cfg = NatsConnector.model_validate({"name": "n", "type": "nats", "stream": "events",
                                        "steps": spec})  # fmt: skip
    return Steps(cfg.steps, NatsConnector.ROUTES, records=False, timeout=1.0)


def test_a_filter_keeps_the_same_messages_whatever_steps_follow_it() -> None:
    """A json column's ``{"price": 9.99}`` (with Postgres' space) was read exactly, as a
    Decimal, once another step rewrote the payload, and 9.99 == 9.99 was false: the message was
    dropped by one connector and kept by the other."""
    raw = b'{"record":{"doc":{"price": 9.99, "n": 1234567890123456789012345}},"action":"x"}'
    keep = {"filter": "record.doc.price == 9.99 and record.doc.price in [9.99]"}
    add = {"transform": {"add": {"s": "{record.doc.n}", "d": "x-{record.doc.price}"}}}
    for spec in ([keep], [keep, add]):
        got = connector_steps(spec).one(Message("s", "p", 1, "c", "insert", "g", "k", raw))
        assert isinstance(got, Message), spec
    assert b'"s":1234567890123456789012345,"d":"x-9.99"' in got.payload  # exact
    assert b'"price":9.99,' in got.payload


@pytest.mark.parametrize(("text", "record", "want"), [
    ("record.flag == 1", {"flag": True}, False),  # true is not 1 (as jsonb)
    ("record.flag != 0", {"flag": False}, True),
    ("record.n in [1, True]", {"n": True}, True),
    ("record.n in [1]", {"n": True}, False),
    ('"a" in record.missing', {}, False),  # a missing field is null: in it, nothing
    ('"a" in record.s', {"s": "cat"}, True),
    ("str(record.big) == '123456789012345678901234567890'",
     {"big": 123456789012345678901234567890}, True),
])  # fmt: skip
def test_expressions_follow_jsons_kinds(text: str, record: dict[str, Any], want: bool) -> None:
    msg = load(orjson.dumps({"record": record}) if "big" not in record else
               b'{"record":{"big":123456789012345678901234567890}}')  # fmt: skip
    assert expr.expression(text)(None, msg["record"], None, None, msg) is want


def test_ordering_true_against_a_number_is_an_error_and_a_huge_number_fails_fast() -> None:
    with pytest.raises(TypeError):
        expr.expression("record.flag > 0")(None, {"flag": True}, None, None, None)
    huge = load(b'{"e":1e1000000}')
    started = time.monotonic()
    with pytest.raises((ValueError, OverflowError)):  # not 25 s of int(Decimal) a message
        expr.expression("int(record.e) > 0")(None, huge, None, None, None)
    assert time.monotonic() - started < 1
    assert dump(huge) == b'{"e":1e1000000}'  # written back as it came


def test_a_rename_onto_a_field_replaces_it_and_nothing_declarative_follows_a_flatten() -> None:
    got = connector_steps([{"transform": {"rename": {"status": "tenant"}}}]).one(
        message({"action": "insert", "record": {"status": "list", "tenant": "a.b"}}))  # fmt: skip
    assert isinstance(got, Message) and orjson.loads(got.payload)["record"] == {"tenant": "list"}
    with pytest.raises(ValidationError, match="after a flatten the message is the record"):
        connector_steps([{"transform": {"flatten": True}}, {"transform": {"drop": ["qty"]}}])


def test_no_function_output_makes_invalid_json() -> None:
    for bad in (Decimal("NaN"), Decimal("-Infinity"), {1: 2}, {"x"}, b"x"):
        with pytest.raises(TypeError):
            dump({"x": bad})
    assert dump({"x": Decimal("1.10")}) == b'{"x":1.10}'


def test_a_webhook_path_field_stays_one_segment() -> None:
    """``.`` and ``..`` as a field's value climbed out of the path (found by an outside tryout)."""
    escape = WebhookConnector.ROUTES["path"].escape
    assert [escape(v) for v in (".", "..", "a/b", "a b")] == ["%2E", "%2E%2E", "a%2Fb", "a%20b"]


def test_a_function_comes_from_functions_dir_only(tmp_path: Path) -> None:
    """An installed module's import-time code ran before the check refused it (``this:s``
    printed the Zen of Python; over the API too)."""
    (tmp_path / "mine.py").write_text("def f(action, record, changes, metadata):\n    return 1\n")
    functions.use_dir(tmp_path)
    try:
        assert functions.load("mine:f")(None, None, None, None) == 1
        sys.modules.pop("this", None)
        for spec in ("this:s", "os:system", "subprocess:run"):
            with pytest.raises(ValueError, match=r"functions come from functions\.dir only"):
                functions.load(spec)
        assert "this" not in sys.modules  # nothing of it ran
    finally:
        functions.use_dir(None)


def test_steps_with_a_function_read_back_as_dumped(tmp_path: Path) -> None:
    """A config read over the API (every default written out) and sent back: a function's
    transform beside ``drop: []`` was refused as not alone, and a consumer with one could not be
    served from the store (found by a test of consumers' steps)."""
    (tmp_path / "mine.py").write_text("def f(action, record, changes, metadata):\n    return 1\n")
    functions.use_dir(tmp_path)
    try:
        steps = [{"filter": "action != 'delete'"}, {"transform": {"function": "mine:f"}}]
        c = NatsConnector.model_validate(
            {"name": "n", "type": "nats", "stream": "events", "steps": steps}
        )
        assert NatsConnector.model_validate(c.model_dump(mode="json")) == c
        w = ConsumerConfig.model_validate({"name": "w", "steps": steps})
        assert ConsumerConfig.model_validate_json(w.model_dump_json()) == w
        with pytest.raises(ValidationError, match="a function transforms alone: move drop"):
            NatsConnector.model_validate({"name": "n", "type": "nats", "stream": "events",
                                          "steps": [{"transform": {"function": "mine:f",
                                                                   "drop": ["x"]}}]})  # fmt: skip
        with pytest.raises(ValidationError, match="an HTTP pull consumer takes no route step"):
            ConsumerConfig.model_validate({"name": "w", "steps": [{"route": {"subject": "x"}}]})
    finally:
        functions.use_dir(None)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_a_routed_topic_is_a_name_kafka_takes_whatever_the_field_holds(value: str) -> None:
    """``topic: orders.{route}`` with ``route: {topic: "{record.tenant}"}``: any tenant text
    gives a topic Kafka takes (its other characters ``_``, empty ``_``); a message whose route
    gives no topic is refused by its name, not sent to ``orders.``."""
    spec = {"name": "k", "type": "kafka", "stream": "events", "kafka": {"topic": "orders.{route}"},
            "steps": [{"route": {"topic": "{record.tenant}"}}]}  # fmt: skip
    cfg = KafkaConnector.model_validate(spec)
    steps = Steps(cfg.steps, KafkaConnector.ROUTES, records=False, timeout=1.0)
    made = steps.one(message({"action": "insert", "record": {"tenant": value}}))
    assert isinstance(made, Message)
    topic = Template(cfg.topic, "events", TOPIC_BAD, "topic").render(made)
    assert re.fullmatch(r"orders\.[A-Za-z0-9._-]+", topic), topic
    with pytest.raises(Unrouted, match=r"its route gives no topic for \{route\}"):
        Template(cfg.topic, "events", TOPIC_BAD, "topic").render(message({"action": "insert"}))
