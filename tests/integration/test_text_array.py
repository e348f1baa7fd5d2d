"""``TextArray`` reaches Postgres as the same ``text[]`` psycopg's list dumper sends."""

from __future__ import annotations

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.embedded import EmbeddedPostgres
from indexers.postgres import TextArray

# Any text Postgres stores (no NUL), quotes, backslashes, braces, commas,
# spaces and NULL-like words included.
_TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)
_TRICKY = st.sampled_from(['"', "\\", "{", "}", ",", " ", "NULL", "null", "", '\\"', "a b", "é", "{a,b}"])


def test_text_array_is_the_list_postgres_reads(postgres: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:

        @settings(max_examples=300, deadline=None)
        @given(st.lists(st.one_of(_TEXT, _TRICKY), max_size=20))
        def check(values: list[str]) -> None:
            row = conn.execute(
                "SELECT %s::text[], %s::text[] IS NOT DISTINCT FROM %s::text[], pg_typeof(%s)::text",
                (TextArray(values), TextArray(values), values, TextArray(values)),
            ).fetchone()
            assert row is not None
            assert row[0] == values
            assert row[1] is True
            assert row[2] == "text[]"

        check()
        # As the id lists are used: ANY and unnest, prepared or not.
        ids = TextArray(["a", 'b"', "c\\"])
        for prepare in (False, True):
            got = conn.execute("SELECT x FROM unnest(%s::text[]) AS x", (ids,), prepare=prepare).fetchall()
            assert [r[0] for r in got] == list(ids)
            (hit,) = conn.execute("SELECT 'b\"' = ANY(%s)", (ids,), prepare=prepare).fetchall()
            assert hit == (True,)
