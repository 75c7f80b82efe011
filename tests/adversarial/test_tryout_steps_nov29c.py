"""Findings of a third Nov 29 outside try-out of steps (docs/transforms.md), against real
servers (PostgreSQL, the HTTP pull API, ``weir config validate``). Each test is one promise of
docs/transforms.md the try-out found broken on the current code; its docstring quotes the
promise and tells what was seen. (The findings of test_tryout_steps_nov29.py and
test_tryout_steps_nov29b.py are not repeated.)

Most are about numbers in json/jsonb columns (“Numbers stay exact … Filters, templates and
arithmetic take a number by the value its digits say (``12345678901234567890.1 <
12345678901234567890.2``, ``1e-400 > 0``)”), seen through an HTTP pull consumer's filter: a
row the filter should keep is dropped."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers import stored
from tests.helpers.api import all_handled, api_serving
from tests.helpers.capture import wait_for
from tests.helpers.cli import weir
from tests.helpers.functions import write_module
from tests.helpers.weir import insert_t, serving, weir_config

ONLY_J = {"collection_id": "public:j"}


def _jtable(url: str, kind: str = "jsonb") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE j (id int PRIMARY KEY, doc {kind})")


def _insert_j(url: str, *rows: tuple[int, str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for row in rows:
            conn.execute("INSERT INTO j VALUES (%s, %s)", row)


def _kept(
    db_url: str, filters: dict[str, str], *rows: tuple[int, str], kind: str = "jsonb"
) -> dict[str, Any]:
    """For each named filter (a consumer of its own), the ids of the rows it kept, and the
    errors of the ones it failed."""
    _jtable(db_url, kind)
    cs = [{"name": name, "stream": "events", "filters": ONLY_J, "steps": [{"filter": f}]}
          for name, f in filters.items()]  # fmt: skip
    with api_serving(db_url, consumers=cs) as client:
        _insert_j(db_url, *rows)
        seen = {name: all_handled(client, name) for name in filters}
    return {name: sorted(m["record"]["data"]["id"] for m in got) + [f.get("error") for f in bad]
            for name, (got, bad) in seen.items()}  # fmt: skip


def _config_file(tmp_path: Path, db_url: str, connector: str, head: str = "") -> Path:
    """weir.yaml of ``head``, the source ``app`` and one connector, as its YAML lines (they
    start at line 4, after a ``head`` of none)."""
    config = tmp_path / "weir.yaml"
    config.write_text(head + "sources:\n"
                      f"  - {{name: app, kind: postgres, url: '{db_url}', schemas: [public]}}\n"
                      "connectors:\n" + connector)  # fmt: skip
    return config


# -- Numbers: literals ------------------------------------------------------------------------


def test_a_number_written_in_the_filter_is_read_as_a_double(db_url: str) -> None:
    """docs/transforms.md “What steps keep”: “Filters, templates and arithmetic take a number by
    the value its digits say (``12345678901234567890.1 < 12345678901234567890.2``, ``1e-400 >
    0``)”, and “Expressions”: literals are “numbers”. The two examples of the docs, written as
    they are in a filter, are FALSE: ``filter: '1e-400 > 0'`` drops every row, and a jsonb
    ``{"a": 12345678901234567890.1}`` is dropped by ``record.doc.a < 12345678901234567890.2``,
    by ``record.doc.a == 12345678901234567890.1`` and by ``record.doc.a in
    [12345678901234567890.1]``: the json value is exact, but the literal of the expression is
    Python's float (1.2345678901234567e+19, and 0.0 for 1e-400), compared by its shortest
    digits 12345678901234567000."""
    doc = '{"a": 12345678901234567890.1}'
    kept = _kept(db_url, {"tiny": "1e-400 > 0",
                          "less": "record.doc.a < 12345678901234567890.2",
                          "same": "record.doc.a == 12345678901234567890.1",
                          "among": "record.doc.a in [12345678901234567890.1]"},
                 (1, doc))  # fmt: skip
    assert kept == {"tiny": [1], "less": [1], "same": [1], "among": [1]}, kept


# -- Numbers: arithmetic ----------------------------------------------------------------------


def test_modulo_and_floor_division_change_with_another_field_of_the_row(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “An expression is written as in Python”, with “``+ - *
    / // %`` … on numbers”, and numbers are taken “by the value [their] digits say”. A jsonb
    ``{"x": -7.5}`` and ``filter: 'record.doc.x % 2 == 0.5 and record.doc.x // 2 == -4'`` (as
    Python computes: -7.5 % 2 is 0.5, -7.5 // 2 is -4) keeps row 1; row 2, ``{"x": -7.5, "y":
    1.10}``, the same ``x`` beside a number orjson would rewrite, is DROPPED: there the payload is
    read exactly and ``x`` is computed as a Decimal, whose ``%`` and ``//`` truncate (-1.5 and
    -3). What a filter says of a field depends on another field's spelling."""
    kept = _kept(db_url, {"mod": "record.doc.x % 2 == 0.5 and record.doc.x // 2 == -4"},
                 (1, '{"x": -7.5}'), (2, '{"x": -7.5, "y": 1.10}'))  # fmt: skip
    assert kept == {"mod": [1, 2]}, kept


def test_a_sum_of_json_numbers_is_a_double_sum_unless_another_field_is_exact(db_url: str) -> None:
    """docs/transforms.md “What steps keep”: “Filters, templates and arithmetic take a number by
    the value its digits say”. ``filter: 'record.doc.a + record.doc.b == 0.3'`` over a jsonb
    ``{"a": 0.1, "b": 0.2}`` (digits that say 0.3) DROPS row 1 (0.1 + 0.2 is the double
    0.30000000000000004), and KEEPS row 2, ``{"a": 0.1, "b": 0.2, "c": 1.10}``, where the
    unrelated ``c`` makes the payload be read exactly and the sum is Decimal 0.3."""
    kept = _kept(db_url, {"sum": "record.doc.a + record.doc.b == 0.3"},
                 (1, '{"a": 0.1, "b": 0.2}'), (2, '{"a": 0.1, "b": 0.2, "c": 1.10}'))  # fmt: skip
    assert kept == {"sum": [1, 2]}, kept


def test_a_big_integer_plus_a_fraction_is_rounded_to_a_double(db_url: str) -> None:
    """docs/transforms.md “What steps keep”: “Filters, templates and arithmetic take a number by
    the value its digits say”. A jsonb ``{"n": 123456789012345678901234567890}`` (30 digits,
    read exactly as an int) and ``filter: 'record.doc.n + 0.5 > record.doc.n'``: the row is
    DROPPED. ``n + 0.5`` is Python's int + float, the double 1.2345678901234568e+29
    (123456789012345677877719597056), which is less than ``n``; so ``str(record.doc.n + 0.5)``
    is ``1.2345678901234568e+29``."""
    kept = _kept(db_url, {"plus": "record.doc.n + 0.5 > record.doc.n",
                          "text": 'str(record.doc.n + 0.5) == "123456789012345678901234567890.5"'},
                 (1, '{"n": 123456789012345678901234567890}'))  # fmt: skip
    assert kept == {"plus": [1], "text": [1]}, kept


def test_arithmetic_on_an_exact_number_rounds_to_28_digits(db_url: str) -> None:
    """docs/transforms.md “What steps keep”: “The payload is read with every number as written
    (a ``numeric`` in a json column with 30 digits …)”; “arithmetic take[s] a number by the
    value its digits say”. A jsonb ``{"a": 12345678901234567890123456789.5}`` (30 digits) and
    ``filter: 'record.doc.a + 0 == record.doc.a'``: DROPPED. The exact number is computed as a
    Decimal in the default context of 28 digits, so ``a + 0`` is
    12345678901234567890123456790; likewise ``record.doc.a - 1 < record.doc.a`` is false."""
    kept = _kept(db_url, {"zero": "record.doc.a + 0 == record.doc.a",
                          "less": "record.doc.a - 1 < record.doc.a"},
                 (1, '{"a": 12345678901234567890123456789.5}'))  # fmt: skip
    assert kept == {"zero": [1], "less": [1]}, kept


def test_unary_minus_makes_an_exact_number_a_double(db_url: str) -> None:
    """docs/transforms.md “Expressions”: “``+ - * / // %`` and unary ``-`` on numbers”, taken
    “by the value [their] digits say (``12345678901234567890.1 < 12345678901234567890.2``)”.
    A jsonb ``{"a": 12345678901234567890.1, "b": 12345678901234567890.2}``: ``record.doc.a <
    record.doc.b`` keeps the row (held), but ``-record.doc.a > -record.doc.b`` DROPS it, and
    ``-record.doc.a == 0 - record.doc.a`` too: unary minus turns the exact number into a plain
    float (-1.2345678901234567e+19), losing its digits, where ``0 - a`` stays exact."""
    kept = _kept(db_url, {"plain": "record.doc.a < record.doc.b",
                          "neg": "-record.doc.a > -record.doc.b",
                          "same": "-record.doc.a == 0 - record.doc.a"},
                 (1, '{"a": 12345678901234567890.1, "b": 12345678901234567890.2}'))  # fmt: skip
    assert kept == {"plain": [1], "neg": [1], "same": [1]}, kept


def test_int_of_an_exact_number_goes_through_a_double(db_url: str) -> None:
    """docs/transforms.md “Expressions”: the calls ``int`` and ``float``; “Numbers stay exact …
    Filters, templates and arithmetic take a number by the value its digits say”. A jsonb
    ``{"a": 12345678901234567890.7}`` and ``filter: 'int(record.doc.a) ==
    12345678901234567890'``: DROPPED, as ``int()`` truncates the double
    (12345678901234567168); ``int(record.doc.a + 0)`` (a Decimal) gives 12345678901234567890."""
    kept = _kept(db_url, {"int": "int(record.doc.a) == 12345678901234567890",
                          "sum": "int(record.doc.a + 0) == 12345678901234567890"},
                 (1, '{"a": 12345678901234567890.7}'))  # fmt: skip
    assert kept == {"int": [1], "sum": [1]}, kept


# -- Config errors name the step ---------------------------------------------------------------


def test_a_route_topic_without_route_in_the_template_does_not_name_the_step(
    db_url: str, tmp_path: Path
) -> None:
    """docs/transforms.md: “``weir config validate`` checks every expression, template and
    function at load (``file:line: connectors[0].steps[1]…: why``, exit 2), and the management
    API answers 422 with the same sentence”; “Route”: “a route giving [topic] without
    ``{route}`` in the template, is a config error”. A Kafka connector with ``kafka.topic: t``
    and ``route: {topic: x}`` as its second step: validate says ``weir.yaml:4: connectors[0]:
    steps: a route's topic fills {route} in kafka.topic …`` (the connector's line and no step
    index, where ``weir.yaml:9: connectors[0].steps[1].route.topic`` was promised), and the
    API's 422 puts it at ``loc: [body, kafka]``. (The other route-field errors, a ``subject`` on
    a webhook or a ``queue`` on Kafka, are named ``steps[1].route.subject`` as promised.)"""
    config = _config_file(
        tmp_path,
        db_url,
        "  - name: c\n"
        "    type: kafka\n"
        "    stream: events\n"
        "    kafka: {bootstrap_servers: '127.0.0.1:1', topic: t}\n"
        "    steps:\n"
        "      - filter: 'True'\n"
        "      - route: {topic: x}\n",  # line 10
    )
    out = weir("config", "validate", "--config", str(config), code=2)
    body = {"name": "c", "type": "kafka", "stream": "events",
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topic": "t"},
            "steps": [{"filter": "True"}, {"route": {"topic": "x"}}]}  # fmt: skip
    with api_serving(db_url) as client:
        r = client.post("/v1/connectors", json=body)
    assert r.status_code == 422, r.text
    assert "weir.yaml:10: connectors[0].steps[1]" in out, out
    assert r.json()["detail"][0]["loc"][:3] == ["body", "steps", 1], r.text


def test_the_api_loc_of_a_step_error_repeats_the_steps_kind(db_url: str) -> None:
    """docs/transforms.md: “``weir config validate`` checks every expression … (``file:line:
    connectors[0].steps[1]…: why``, exit 2), and the management API answers 422 with the same
    sentence.” For ``filter: 'record.a ** 2'`` as a connector's (or an HTTP pull consumer's)
    second step, validate says ``connectors[0].steps[1].filter: the operator Pow …``, but the
    API's 422 ``loc`` is ``[body, steps, 1, filter, filter]``; a transform's function
    ``[body, steps, 1, transform, transform, function]`` and an enrich's sql ``[body, steps, 1,
    enrich, enrich, sql]``: the step's kind twice (the union's tag), a path that is in no
    request. A route's is right: ``[body, steps, 1, route, subject]``."""
    bad = {"filter": "record.a ** 2"}
    with api_serving(db_url) as client:
        locs = []
        for kind, body in (
            ("connectors", {"name": "c", "type": "nats", "stream": "events",
                            "steps": [{"filter": "True"}, bad]}),
            ("http-consumers", {"name": "c", "stream": "events",
                                "steps": [{"filter": "True"}, bad]}),
        ):  # fmt: skip
            r = client.post(f"/v1/{kind}", json=body)
            assert r.status_code == 422, r.text
            locs.append(r.json()["detail"][0]["loc"])
    assert locs == [["body", "steps", 1, "filter"]] * 2, locs


def test_a_function_module_importing_a_missing_module_gives_no_file_and_line(
    db_url: str, tmp_path: Path
) -> None:
    """docs/transforms.md “Functions”: “A missing module, an import error (with its file and
    line), a missing function or one that cannot take the four arguments are config errors.”
    ``functions/shaping.py`` whose line 3 is ``import nothing_here_x`` (a module that is not
    installed — the commonest import error): validate says ``… transform.function: function
    'shaping:redact': shaping imports nothing_here_x, which is missing`` — no file, no line.
    Any other import error is told with both (``importing shaping failed at
    …/functions/shaping.py:3: RuntimeError: …``), and so is an import that fails in a module
    ``shaping`` imports."""
    fns = tmp_path / "functions"
    fns.mkdir()
    (fns / "shaping.py").write_text(
        "import json\n"
        "\n"
        "import nothing_here_x\n"
        "\n"
        "def redact(action, record, changes, metadata):\n"
        "    return None\n"
    )
    config = _config_file(
        tmp_path,
        db_url,
        "  - name: c\n"
        "    type: nats\n"
        "    stream: events\n"
        "    steps:\n"
        "      - transform: {function: 'shaping:redact'}\n",  # line 9
        head="functions: {dir: functions}\n",
    )
    out = weir("config", "validate", "--config", str(config), code=2)
    assert "weir.yaml:9: connectors[0].steps[0].transform" in out, out  # held
    assert f"{fns / 'shaping.py'}:3" in out, out


# -- Numbers: add's values -------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason=(
        "an add's number is read as YAML and JSON read it, a double (docs/design.md “Known limits”)"
    ),
)
def test_an_added_number_written_in_yaml_is_rounded_to_a_double(
    db_url: str, tmp_path: Path
) -> None:
    """docs/transforms.md “Transform”: “``add: {field: value}`` adds fields to the record: a value
    as given”; “Numbers stay exact. The payload is read with every number as written (… ``1.10``,
    ``-0``) and written back so”. A connector's ``transform: {add: {tiny: 1e-400, price: 1.10,
    big: 0.1000000000000000055511151231257827}}`` in weir.yaml: ``weir transform test`` shows the
    record with ``"tiny":0.0,"price":1.1,"big":0.1`` — the YAML number is read as a Python float
    (1e-400 becomes 0.0, the 34 digits 0.1), not as given; the same digits in a jsonb column go
    out exact."""
    _jtable(db_url)
    with serving(weir_config(db_url, [])):
        _insert_j(db_url, (1, "{}"))
        wait_for(lambda: len(stored.events(db_url)) >= 1, what="the row stored")
    config = _config_file(
        tmp_path,
        db_url,
        "  - name: c\n"
        "    type: nats\n"
        "    stream: events\n"
        "    collections: ['public:j']\n"
        "    steps:\n"
        "      - transform: {add: {tiny: 1e-400, price: 1.10,\n"
        "                          big: 0.1000000000000000055511151231257827}}\n",
    )
    out = weir("transform", "test", "--config", str(config), "--connector", "c")
    assert "1 messages: 1 sent" in out, out
    made = next(line for line in out.splitlines() if line.strip().startswith("out"))
    assert '"tiny":1e-400' in made and '"price":1.10' in made, made
    assert '"big":0.1000000000000000055511151231257827' in made, made


# -- Functions past functions.timeout -----------------------------------------------------------


def test_a_change_over_the_api_lets_four_more_stuck_calls_run(
    webhook_receiver: Receiver, table: str, functions_dir: Path
) -> None:
    """docs/transforms.md “Functions”: “Python cannot stop a thread: once 4 such calls still
    run, the connector's function steps fail their messages at once, saying so, until the
    function is fixed and ``weir run`` restarted.” A webhook connector made over the API whose
    function hangs (``time.sleep(15)``), ``functions.timeout: 200ms``: 6 rows leave 4 threads
    running and fail the last 2 “at once” (held). Then the connector's steps are changed over
    the API (a ``filter: 'True'`` put first, the same function) and 6 more rows come: 4 MORE
    calls are left running (8 ``weir-steps`` threads alive, each holding a thread and maybe a
    core), each failing only after its timeout; the count of calls still running is kept per
    session (core/engine/session.py makes Steps anew), not until ``weir run`` restarts. Each
    change (or session restart) adds 4 more."""
    write_module(functions_dir / "hang.py", "import time\n"
                 "def f(action, record, changes, metadata):\n"
                 "    time.sleep(15)\n"
                 "    return None\n")  # fmt: skip
    h = WebhookHarness(webhook_receiver)
    c = h.connector("hang", "events", steps=[{"transform": {"function": "hang:f"}}])
    h.prepare(c)

    def stuck() -> int:
        return sum(t.name == "weir-steps" and t.is_alive() for t in threading.enumerate())

    def failed(client: httpx.Client) -> list[Any]:
        return list(client.get("/v1/connectors/hang/failed").json()["data"])

    functions = {"dir": str(functions_dir), "timeout": "200ms"}
    with api_serving(table, functions=functions) as client:
        assert client.post("/v1/connectors", json=c).status_code == 201
        for i in range(1, 7):
            insert_t(table, range(i, i + 1))
        wait_for(lambda: len(failed(client)) >= 6, timeout=60, what="6 failed")
        assert stuck() == 4  # held
        steps = [{"filter": "True"}, {"transform": {"function": "hang:f"}}]
        assert client.put("/v1/connectors/hang", json={**c, "steps": steps}).status_code == 200
        time.sleep(2)
        for i in range(7, 13):
            insert_t(table, range(i, i + 1))
        wait_for(lambda: len(failed(client)) >= 12, timeout=60, what="12 failed")
        after = stuck()
        errors = [f["error"] for f in failed(client)][6:]
    assert after == 4, (after, errors)


# -- Enrich ------------------------------------------------------------------------------------


def test_an_enrich_after_a_flatten_sends_every_message_without_its_row(db_url: str) -> None:
    """docs/transforms.md “Enrich”: “``enrich:`` joins a row of the source database to each
    message … ``into``: the record's field the row goes in (…): an object of the row's columns,
    or null when the query returned none”; “Steps after an enrich step see the row”; and “After
    a ``flatten`` the message is the record … (refused at load; a filter reads
    ``message.status`` there)”. Steps ``[transform: {flatten: true}, enrich: {key: message.id,
    into: row, …}]`` are accepted at load (by the API and validate), and every message then goes
    out WITHOUT ``row`` — neither the row nor null: the enrich looks for ``message.record``,
    which a flattened message has not, and silently does nothing (a filter after it on
    ``message.row`` drops everything). It is neither refused as the declarative transforms
    after a flatten are, nor does it join the row to the message it has."""
    _jtable(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE cust (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO cust VALUES (1, 'ann')")
    enrich = {"sql": "SELECT id, name FROM cust WHERE id = ANY(%(ids)s::int[])",
              "key": "message.id", "into": "row"}  # fmt: skip
    c = {"name": "flat", "stream": "events", "filters": ONLY_J,
         "steps": [{"transform": {"flatten": True}}, {"enrich": enrich}]}  # fmt: skip
    with api_serving(db_url, consumers=[c]) as client:
        _insert_j(db_url, (1, "{}"))
        got, failed = all_handled(client, "flat")
    assert failed == [] and len(got) == 1, (got, failed)
    assert got[0]["record"]["data"].get("row") == {"id": 1, "name": "ann"}, got[0]["record"]


# -- Functions' dicts --------------------------------------------------------------------------


def test_a_function_returning_a_dict_subclass_fails_or_hides_its_fields(
    db_url: str, functions_dir: Path
) -> None:
    """docs/transforms.md “Functions”: a function “Returns the message to send (a dict: what the
    subscriber gets), or None to drop it”; “The values are JSON's: dicts, lists, …”; and “A
    message its steps cannot make goes to the failed list …: a function that returns something
    that is not a dict or None”. A function returning ``collections.OrderedDict(action=…,
    record=…)`` — a dict — has its message FAILED: ``StepFailed: steps[0] transform: StepError:
    f:ordered returned OrderedDict, not a dict or None``; and one returning a plain dict whose
    record is a ``defaultdict`` is sent, but a ``filter: 'record.id == 1'`` after it DROPS it:
    the filter reads every field of a record that is not exactly ``dict`` as null."""
    write_module(functions_dir / "f.py",
                 "import collections\n"
                 "def ordered(action, record, changes, metadata):\n"
                 "    return collections.OrderedDict(action=action, record=record)\n"
                 "def default(action, record, changes, metadata):\n"
                 "    r = collections.defaultdict(lambda: None, record)\n"
                 "    return {'action': action, 'record': r}\n")  # fmt: skip
    cs = [{"name": "ordered", "stream": "events", "filters": ONLY_J,
           "steps": [{"transform": {"function": "f:ordered"}}]},
          {"name": "default", "stream": "events", "filters": ONLY_J,
           "steps": [{"transform": {"function": "f:default"}},
                     {"filter": "record.id == 1"}]}]  # fmt: skip
    _jtable(db_url)
    functions = {"dir": str(functions_dir)}
    with api_serving(db_url, consumers=cs, functions=functions) as client:
        _insert_j(db_url, (1, "{}"))
        seen = {name: all_handled(client, name) for name in ("ordered", "default")}
    kept = {name: ([m["record"]["data"]["id"] for m in got], [f.get("error") for f in bad])
            for name, (got, bad) in seen.items()}  # fmt: skip
    assert kept == {"ordered": ([1], []), "default": ([1], [])}, kept
