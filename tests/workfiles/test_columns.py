"""Columns built and read through their buffers equal pyarrow's own conversions."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.workfiles import columns

_texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]))


@settings(deadline=None)
@given(values=st.lists(st.one_of(st.none(), _texts)), cut=st.integers(0, 5))
def test_strings_round_trip(values: list[str | None], cut: int) -> None:
    built = columns.string_column(values)
    assert built.equals(pa.array(values, pa.string()))
    assert columns.to_strings(built) == values
    assert columns.to_strings(built.slice(min(cut, len(values)))) == values[cut:]
    assert columns.to_strings(pa.array(values, pa.large_string())) == values
    assert columns.to_strings(pa.chunked_array([built, built], pa.string())) == values + values


@settings(deadline=None)
@given(values=st.lists(st.one_of(st.text(st.characters(max_codepoint=127)), _texts)))
def test_strings_without_nulls_round_trip(values: list[str]) -> None:
    """All-ASCII columns take one encode for all; a single non-ASCII value takes the general path."""
    built = columns.string_column(values)
    assert built.equals(pa.array(values, pa.string())) and built.null_count == 0
    assert columns.to_strings(built) == values


@given(values=st.lists(st.integers(-2**63, 2**63 - 1)), cut=st.integers(0, 5))
def test_integers_round_trip(values: list[int], cut: int) -> None:
    built = columns.int_column(values, pa.int64())
    assert built.equals(pa.array(values, pa.int64()))
    assert columns.to_numbers(built.slice(min(cut, len(values)))).tolist() == values[cut:]
    small = [value % 2**31 for value in values]
    assert columns.int_column(small, pa.int32()).equals(pa.array(small, pa.int32()))
    assert columns.to_numbers(pa.array(small, pa.int32())).tolist() == small


@given(values=st.lists(st.booleans()), cut=st.integers(0, 9))
def test_booleans_round_trip(values: list[bool], cut: int) -> None:
    built = columns.bool_column(values)
    assert built.equals(pa.array(values, pa.bool_()))
    assert columns.to_numbers(built.slice(min(cut, len(values)))).tolist() == values[cut:]


@given(values=st.lists(st.binary(min_size=16, max_size=16)))
def test_fixed_binary_equals_pyarrow(values: list[bytes]) -> None:
    assert columns.fixed_binary_column_of(b"".join(values), 16, len(values)).equals(pa.array(values, pa.binary(16)))
