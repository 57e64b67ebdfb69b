"""Edges and nodes objects: routed by document, each record once, a range read back is exactly the
records whose owner routes to it, a damaged route is refused; several drops objects merge, in
bounded memory, into the bytes one write of all their records makes, and a record two of them
hold, or one out of order, is refused."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.neardup.stars import route_of
from prep.workfiles import indexed
from prep.workfiles.drops import drop_records, merge_drops, write_drops
from prep.workfiles.edges import EDGES, NODES, edge_records, node_records, read_range, write_edges, write_nodes

Array = np.ndarray[Any, Any]
NUMBERS = st.integers(0, 5).flatmap(lambda part: st.integers(0, 30).map(lambda row: part << 32 | row))
EDGE_LISTS = st.lists(st.tuples(NUMBERS, NUMBERS), max_size=60)


@settings(max_examples=60, deadline=None)
@given(EDGE_LISTS, st.integers(0, 4))
def test_a_range_of_an_edges_object_is_the_edges_its_owners_route_to(edges: list[tuple[int, int]], bits: int) -> None:
    owner = np.array([a for a, _ in edges], dtype=np.uint64)
    neighbour = np.array([b for _, b in edges], dtype=np.uint64)
    records = edge_records(np.concatenate([owner, owner]), np.concatenate([neighbour, neighbour]))
    distinct = {(a, b) for a, b in edges if a != b}
    assert len(records) == len(distinct)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "edges"
        write_edges(path, records, {})
        for bucket in range(1 << bits):
            held = read_range([path, path], EDGES, bucket, bits)[: len(records)]
            expected = {(a, b) for a, b in distinct
                        if bits == 0 or int(route_of(np.array([a], dtype=np.uint64))[0]) >> (64 - bits) == bucket}
            found = set(zip(held["owner"].tolist(), held["neighbour"].tolist()))
            assert found == expected


def test_nodes_keep_each_document_once_with_its_key() -> None:
    records = node_records(np.array([9, 4, 9], dtype=np.uint64), np.array([1, 2, 1], dtype=np.uint64))
    assert sorted(zip(records["document"].tolist(), records["key_hi"].tolist())) == [(4, 2), (9, 1)]
    assert np.array_equal(records["route"], np.sort(route_of(records["document"])))


def test_a_record_whose_route_is_not_its_owners_is_refused(tmp_path: Path) -> None:
    records = node_records(np.array([1, 2, 3], dtype=np.uint64), np.array([5, 6, 7], dtype=np.uint64))
    records["document"][1] += np.uint64(1)  # damaged, still in route order
    write_nodes(tmp_path / "nodes", records, {})
    with pytest.raises(IntegrityError, match="route"):
        read_range([tmp_path / "nodes"], NODES, 0, 0)


DROPS = st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**40)), unique_by=lambda item: item[1],
                 max_size=300)


@settings(max_examples=60, deadline=None)
@given(DROPS, st.integers(1, 6), st.integers(1, 4000), st.randoms(use_true_random=False))
def test_drops_objects_merge_into_the_bytes_of_one_write(drops: list[tuple[int, int]], objects: int, budget: int,
                                                         rng: Any) -> None:
    keys = np.array([key for key, _ in drops], dtype=np.uint64)
    keys[::4] = keys[0] if len(drops) else 0  # equal keys, ordered by document
    documents = np.array([document for _, document in drops], dtype=np.uint64)
    owners = np.array([rng.randrange(objects) for _ in drops], dtype=np.int64)
    with tempfile.TemporaryDirectory() as directory, pytest.MonkeyPatch.context() as patch:
        folder = Path(directory)
        write_drops(folder / "whole", drop_records(documents, documents >> np.uint64(1), keys), {})
        paths = []
        for index in range(objects):
            mine = owners == index
            write_drops(folder / f"{index}", drop_records(documents[mine], documents[mine] >> np.uint64(1), keys[mine]), {})
            paths.append(folder / f"{index}")
        patch.setattr(indexed, "MERGE_BYTES", budget)  # a few records at a time
        merge_drops(folder / "merged", paths)
        assert (folder / "merged").read_bytes() == (folder / "whole").read_bytes()
        assert not list(folder.glob("*.records"))


def test_a_document_two_drops_objects_hold_is_refused_and_leaves_no_scratch(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_drops(tmp_path / name, drop_records(np.array([5, 6], dtype=np.uint64), np.array([1, 1], dtype=np.uint64),
                                                  np.array([3, 4], dtype=np.uint64)), {})
    with pytest.raises(IntegrityError, match="hold one record"):
        merge_drops(tmp_path / "merged", [tmp_path / "a", tmp_path / "b"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "b"]


def test_a_drops_object_out_of_order_is_refused(tmp_path: Path) -> None:
    records = drop_records(np.array([5, 6, 7], dtype=np.uint64), np.array([1, 1, 1], dtype=np.uint64),
                           np.array([3, 3, 3], dtype=np.uint64))
    write_drops(tmp_path / "a", records[::-1].copy(), {})
    with pytest.raises(IntegrityError, match="out of order"):
        merge_drops(tmp_path / "merged", [tmp_path / "a"])
