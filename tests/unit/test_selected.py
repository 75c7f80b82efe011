"""What a selection names that its sources do not have: said for each pattern and filter
column that matches nothing, never for one that matches something."""

from hypothesis import given
from hypothesis import strategies as st

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
