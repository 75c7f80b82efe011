"""What a selection names that its sources do not have: said for each pattern and filter
column that matches nothing, never for one that matches something."""

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.sources.pg import selected
from core.sources.pg.selected import unmatched

NAMES = st.text(st.characters(codec="utf-8", exclude_characters="*\x00"), min_size=1, max_size=12)
CATALOG = st.dictionaries(NAMES, st.lists(NAMES, max_size=4), min_size=1, max_size=6)


@given(CATALOG, st.data())
def test_what_matches_is_never_said(known: dict[str, list[str]], data: st.DataObject) -> None:
    collection = data.draw(st.sampled_from(sorted(known)))
    columns = known[collection] or ["x"]
    known[collection] = columns
    column = data.draw(st.sampled_from(columns))
    prefix = collection[: data.draw(st.integers(0, len(collection)))]
    patterns = [collection, prefix + "*"]
    assert unmatched(patterns, [("filters: column", column)], known) == []


@given(CATALOG, NAMES, NAMES)
def test_what_matches_nothing_is_said(known: dict[str, list[str]], typo: str, col: str) -> None:
    problems = unmatched([typo], [("group_columns:", col)], known)
    assert (typo not in known) == any(p.startswith(f"collections: {typo!r}") for p in problems)
    columns = {c for cols in known.values() for c in cols}
    selected = known.get(typo, [])
    pool = set(selected) if typo in known else columns
    said = any(p.startswith(f"group_columns: {col!r}") for p in problems)
    assert said == (bool(pool) and col not in pool)


def test_each_source_is_read_once_for_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """At start every connector and consumer is checked: against one catalog read a source,
    not one a connector; those of a source that does not answer are not checked."""
    cfg = WeirConfig.model_validate({
        "sources": [{"name": n, "kind": "postgres", "url": f"postgresql://h/{n}",
                     "schemas": ["public"]} for n in ("a", "b", "down")],
        "connectors": [{"name": f"w{k}", "type": "webhook", "stream": "events",
                        "webhook": {"url": "http://h/x"},
                        "sources": sources, "collections": ["public:nope"]}
                       for k, sources in enumerate([["a"], ["a", "b"], ["b"], ["down"]])],
        "consumers": [{"name": "c", "sources": ["a"], "group_columns": ["nope"]}],
        "api": {"tokens": ["a-token-of-24-characters"]},
    })  # fmt: skip
    read: list[str] = []

    def catalog(src: PostgresSource) -> dict[str, list[str]]:
        read.append(src.name)
        if src.name == "down":
            raise psycopg.OperationalError("connection refused")
        return {f"public:{src.name}": ["id"]}

    monkeypatch.setattr(selected, "catalog", catalog)
    problems = selected.selection_problems(cfg, [*cfg.connectors, *cfg.consumers])
    assert sorted(read) == ["a", "b", "down"]
    assert [p.split(":")[0] for p in problems] == [
        "connector w0", "connector w1", "connector w2", "consumer c"]  # fmt: skip
