"""prep.formats.sidecar: the `.bin`'s metadata file takes each key's value text straight out of a
document's spelled metadata object, which must be exactly that value's own spelling."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from prep.formats.jsonspelling import spell
from prep.formats.sidecar import columns, members

_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
_objects = st.dictionaries(st.text(max_size=6), _values, max_size=5)


@given(_objects)
def test_each_member_is_its_values_own_spelling(metadata: dict[str, Any]) -> None:
    assert list(members(spell(metadata))) == [(key, spell(metadata[key])) for key in sorted(metadata)]


@given(st.lists(_objects, max_size=6))
def test_columns_hold_each_keys_spelling_or_null(documents: list[dict[str, Any]]) -> None:
    keys = tuple(sorted({key for document in documents for key in document if key != "id"}))
    documents = [{key: value for key, value in document.items() if key != "id"} for document in documents]
    found = columns([str(n) for n in range(len(documents))], [spell(d).encode() for d in documents], keys)
    assert found["id"] == [str(n) for n in range(len(documents))]
    for key in keys:
        assert found[key] == [spell(document[key]) if key in document else None for document in documents]
