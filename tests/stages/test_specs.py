"""The packed part tables jobs name by object id: their bytes round-trip, and bytes that are not
a table are refused rather than misread."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.stages.specs import PartTable, ShardParts

SOURCES = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12) | \
    st.just("a\nb.jsonl") | st.just("\udcff.jsonl")
OFFSETS = st.integers(0, 2**63 - 1)
IDS = st.binary(min_size=32, max_size=32).map(lambda raw: f"sha256:{raw.hex()}")


@given(st.lists(st.tuples(SOURCES, OFFSETS), max_size=30))
def test_a_part_table_round_trips_through_its_bytes(parts: list[tuple[str, int]]) -> None:
    table = PartTable.of(parts)
    data = table.to_bytes()
    assert len(data) == 40 * len(parts) and PartTable.from_bytes(data) == table


@given(st.lists(st.tuples(IDS, SOURCES, OFFSETS), max_size=30))
def test_a_shard_parts_table_round_trips_through_its_bytes(parts: list[tuple[str, str, int]]) -> None:
    table = ShardParts.of(parts)
    again = ShardParts.from_bytes(table.to_bytes())
    assert again == table and again.object_ids() == [object_id for object_id, _, _ in parts]


@given(st.lists(st.tuples(IDS, SOURCES, OFFSETS), min_size=1, max_size=10), st.data())
def test_a_cut_or_padded_shard_parts_table_is_refused(parts: list[tuple[str, str, int]], data: st.DataObject) -> None:
    raw = ShardParts.of(parts).to_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    for bad in (raw[:cut], raw + b"\0"):
        with pytest.raises(ValueError):
            ShardParts.from_bytes(bad)


def test_a_part_table_of_a_length_no_table_has_is_refused() -> None:
    with pytest.raises(ValueError, match="40 a part"):
        PartTable.from_bytes(b"\0" * 41)
