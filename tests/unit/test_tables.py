"""Table names in the config and on the command line: schema.table, quoted parts allowed."""

from __future__ import annotations

import pytest

from core.config.sources import PostgresSource
from core.tables import parse_table, table_name


def test_parse_table_reads_sql_style_quotes() -> None:
    cases = {
        "public.users": ("public", "users"),
        "public.Users": ("public", "Users"),  # as written: no folding to lower case
        'public."my.table"': ("public", "my.table"),
        '"My Schema".orders': ("My Schema", "orders"),
        '"a.b"."c.d"': ("a.b", "c.d"),
        '"say ""hi""".t': ('say "hi"', "t"),
        '"public".users': ("public", "users"),
    }
    for text, parts in cases.items():
        assert parse_table(text) == parts, text
        assert parse_table(table_name(*parts)) == parts  # written back, read the same


def test_table_name_quotes_only_what_needs_it() -> None:
    assert table_name("public", "users") == "public.users"
    assert table_name("public", "my.table") == 'public."my.table"'
    assert table_name("My Schema", 'a"b') == 'My Schema."a""b"'


@pytest.mark.parametrize(
    "text", ["users", "a.b.c", ".t", "s.", '"s.t', 's."t', 'pub"lic.t', '"".t', 's."a"b', ""]
)
def test_parse_table_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"tables are written schema\.table"):
        parse_table(text)


def test_config_keys_are_compared_in_one_spelling() -> None:
    src = PostgresSource.model_validate({
        "name": "app", "kind": "postgres", "url": "postgresql://x",
        "tables": ['"public"."my.table"', '"public".t'],
        "key_columns": {'"public"."my.table"': ["id"]},
        "backfill": {"tables": ['"public".t'], "sort_columns": {'"public"."my.table"': "at"}},
    })  # fmt: skip
    assert src.tables == ['public."my.table"', "public.t"]
    assert src.key_columns == {'public."my.table"': ["id"]}
    assert src.backfill is not None
    assert src.backfill.tables == ["public.t"]
    assert src.backfill.sort_columns == {'public."my.table"': "at"}
