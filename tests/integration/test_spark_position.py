"""A named Spark query's position in the store (spark/position.py, docs/spark.md “What a query
keeps”): one query of a name keeps it; a query started again takes it over; a second query of
the same name running beside the first makes the first fail with one line saying so, instead
of the two moving one position back and forth (retention would wait for either)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config.load import load_config
from core.runtime.service import prepare
from spark.options import spec_of
from spark.position import Position
from spark.typed import SourceError
from tests.helpers.weir import cursor_of


def test_a_second_query_of_one_name_fails_the_first_and_a_restart_takes_over(
    tmp_path: Path, table: str
) -> None:
    config = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    config.write_text(json.dumps({"sources": [source], "connectors": []}))
    prepare(load_config(config))  # the store, as weir run makes it
    spec = spec_of({"config": str(config), "name": "lake"})
    first = Position(spec)
    first.note(5)
    first.note(8)
    assert cursor_of(table, "spark:lake")[0] == 8
    second = Position(spec)  # another driver with the same name, from its own checkpoint
    second.note(3)
    assert cursor_of(table, "spark:lake")[0] == 3
    with pytest.raises(SourceError) as e:
        first.note(12)
    assert str(e.value) == (
        "another query named 'lake' of source app started since this one and keeps the "
        "position now: give each query its own name (option name)"
    )
    second.note(4)
    assert cursor_of(table, "spark:lake")[0] == 4
    # The second one's driver killed and the query started again from its checkpoint: a new
    # run, which takes the position over; another name is a position of its own.
    restarted = Position(spec)
    restarted.note(4)
    restarted.note(20)
    other = Position(spec_of({"config": str(config), "name": "totals"}))
    other.note(1)
    assert cursor_of(table, "spark:lake")[0] == 20 and cursor_of(table, "spark:totals")[0] == 1
