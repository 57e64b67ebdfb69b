"""What `prep trace --all` looks for: `id:` and `text:` specs, and a bare argument read as an id
and, when it is 32 hex digits, as a text hash too."""

from __future__ import annotations

import pytest

from prep.history.everywhere import Query
from tests.helpers import run_prep


def test_a_spec_names_ids_and_text_hashes() -> None:
    digest = "0123456789abcdef" * 2
    assert Query.parse(f"id:{digest}") == Query(frozenset([digest]))
    assert Query.parse(f"text:{digest.upper()}") == Query(texts=frozenset([digest]))
    assert Query.parse(digest.upper()) == Query(frozenset([digest.upper()]), frozenset([digest]))
    assert Query.parse("doc-7") == Query(frozenset(["doc-7"]))
    assert not Query() and Query.parse("doc-7")
    with pytest.raises(ValueError, match="32 hex digits"):
        Query.parse("text:doc-7")


def test_a_malformed_spec_is_a_usage_error_before_the_store_is_read() -> None:
    result = run_prep("trace", "--all", "text:xyz", "--store", "/nonexistent/store", check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "prep: error: trace --all: 'text:xyz': a text hash is 32 hex digits " \
        "(text:<XXH3-128 as prep trace prints it>)"
    assert run_prep("trace", "--all", "a", "b", check=False).returncode == 2
    assert run_prep("trace", "tiny@latest", check=False).returncode == 2
