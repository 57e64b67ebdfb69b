"""Merging parts' entries into runs changes nothing an order task makes: its bucket object is the
same bytes from runs of any fan-in and round count as from the parts themselves; a run is sorted
by (key, part, row) and its index finds every bucket; a merge holds one key slice at a time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.runner.merging import merge_groups
from prep.stages import merge, order
from prep.stages.specs import Part, PartTable
from prep.workfiles import entries as entry_objects
from prep.workfiles import keys
from prep.workfiles.intermediate import IntermediateWriter, read_columns

SEED = 5
DTYPE = np.dtype(np.uint16)


def _part(folder: Path, name: str, docs: list[tuple[int, int]]) -> Part:
    """An intermediate with one document per (hash seed, token count), equal seeds being equal
    texts; ids of varying length, every third document without one."""
    texts = [f"text-{h}".encode() for h, _ in docs]
    hashes = [h.to_bytes(8, "little") + (h * 7919).to_bytes(8, "little") for h, _ in docs]
    ids = [None if row % 3 == 2 else f"{name}-{'x' * (row % 5)}{row}" for row in range(len(docs))]
    path = folder / f"{name}.part"
    with IntermediateWriter(path, DTYPE) as writer:
        writer.write_batch(range(len(docs)), ids, texts, hashes, [False] * len(docs),
                           [np.zeros(n, DTYPE) for _, n in docs])
    return Part(path, f"{name}.jsonl", "jsonl", 0, len(docs))


def _part_entries(folder: Path, parts: list[Part]) -> list[tuple[Path, int]]:
    """Each part's entries object, with its ordinal."""
    sources = []
    for ordinal, part in enumerate(parts):
        path = folder / f"entries-{ordinal}"
        entry_objects.write_part_entries(path, read_columns(part.path, entry_objects.PART_COLUMNS), SEED)
        sources.append((path, ordinal))
    return sources


def _merge_rounds(folder: Path, sources: list[tuple[Path, int]], fan_in: int,
                  slice_entries: int) -> list[tuple[Path, int]]:
    """Merge as the runner does: rounds of consecutive groups (a group of one passes through)
    until at most `fan_in` are left."""
    level, made = list(sources), 0
    while len(level) > fan_in:
        following = []
        for first, end in merge_groups(len(level), fan_in):
            group = level[first:end]
            if len(group) == 1:
                following.append(group[0])
                continue
            made += 1
            path = folder / f"run-{made}"
            merge.merge_runs([(p, base - group[0][1]) for p, base in group], path, slice_entries)
            following.append((path, group[0][1]))
        level = following
    return level


def _buckets(folder: Path, name: str, sources: list[tuple[Path, int]], parts: list[Part], bits: int,
             exact: bool) -> list[tuple[bytes, dict[str, object]]]:
    identities = PartTable.of([(part.source, part.line_offset) for part in parts])
    made = []
    for bucket in range(1 << bits):
        path = folder / f"{name}-{bucket}"
        _, summary = order.order_bucket(sources, identities, bucket, bits, exact, 64, 2, path)
        made.append((path.read_bytes(), summary))
    return made


_corpora = st.lists(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 9)), max_size=40), min_size=2, max_size=9)


@settings(max_examples=30, deadline=None)
@given(corpus=_corpora, fan_in=st.integers(2, 4), slice_entries=st.integers(1, 40), bits=st.integers(0, 3),
       exact=st.booleans())
# A bucket whose documents have no ids, read from a run whose other documents have: its id
# offsets were the run's, so its bytes (and the snapshot) depended on the fan-in.
@example(corpus=[[], [(0, 0), (0, 0), (40, 0)], [(16, 0)]], fan_in=2, slice_entries=1, bits=3, exact=False)
def test_buckets_from_runs_are_the_buckets_from_parts(corpus: list[list[tuple[int, int]]], fan_in: int,
                                                       slice_entries: int, bits: int, exact: bool) -> None:
    """Equal hashes across parts are duplicates: the first in input order is kept either way."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        parts = [_part(folder, f"p{index}", docs) for index, docs in enumerate(corpus)]
        sources = _part_entries(folder, parts)
        runs = _merge_rounds(folder, sources, fan_in, slice_entries)
        assert len(runs) <= fan_in
        assert _buckets(folder, "from-runs", runs, parts, bits, exact) == \
            _buckets(folder, "from-parts", sources, parts, bits, exact)


@settings(max_examples=25, deadline=None)
@given(corpus=_corpora, slice_entries=st.integers(1, 30), bits=st.integers(0, 6))
def test_a_run_is_in_key_then_input_order_and_its_index_finds_every_bucket(
        corpus: list[list[tuple[int, int]]], slice_entries: int, bits: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        parts = [_part(folder, f"p{index}", docs) for index, docs in enumerate(corpus)]
        sources = _part_entries(folder, parts)
        merge.merge_runs([(path, base) for path, base in sources], folder / "run", slice_entries)
        run = entry_objects.EntryFile.open(folder / "run")
        assert (run.header["kind"], run.header["count"], run.header["parts"]) == ("run", sum(map(len, corpus)), len(parts))
        entries, ids = run.read(0, run.header["count"])
        placed = list(zip(entries["key_hi"].tolist(), entries["key_lo"].tolist(), entries["part"].tolist(),
                          entries["row"].tolist()))
        assert placed == sorted(placed)
        assert sorted((part, row) for _, _, part, row in placed) == \
            [(part, row) for part, docs in enumerate(corpus) for row in range(len(docs))]
        for bucket in range(1 << bits):
            found = _documents(*run.read_bucket(bucket, bits))
            assert found == [doc for doc, prefix in zip(_documents(entries, ids),
                                                        keys.bucket_of(entries["key_hi"], bits)) if prefix == bucket]


def _documents(entries: np.ndarray, ids: bytes) -> list[tuple[object, ...]]:
    """Every entry's fields but where its id sits, and the id itself (None when it has none)."""
    fields = [name for name in entry_objects.ENTRY_DTYPE.names or () if name != "id_offset"]
    return [(*(entry[name].item() for name in fields),
             None if entry["id_len"] == entry_objects.NO_ID else ids[entry["id_offset"]:entry["id_offset"] + entry["id_len"]])
            for entry in entries]


def test_a_merge_holds_one_key_slice_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [_part(tmp_path, f"p{index}", [(index * 1000 + doc, 1) for doc in range(400)]) for index in range(5)]
    sources = _part_entries(tmp_path, parts)
    held: list[int] = []
    real = merge.read_slice

    def counting(*args: object) -> tuple[np.ndarray, bytes]:
        entries, ids = real(*args)  # type: ignore[arg-type]
        held.append(len(entries))
        return entries, ids

    monkeypatch.setattr(merge, "read_slice", counting)
    merge.merge_runs(sources, tmp_path / "run", slice_entries=100)
    assert sum(held) == 2000 and len(held) == 32  # 2000 / 100 -> 20 slices -> the next power of two
    assert max(held) < 200


def test_a_damaged_input_or_a_bucket_object_is_refused(tmp_path: Path) -> None:
    parts = [_part(tmp_path, f"p{index}", [(index * 100 + doc, 2) for doc in range(30)]) for index in range(3)]
    sources = _part_entries(tmp_path, parts)
    cut = tmp_path / "cut"
    cut.write_bytes(sources[1][0].read_bytes()[:-200])
    with pytest.raises(IntegrityError, match="shorter than its header says"):
        merge.merge_runs([sources[0], (cut, 1), sources[2]], tmp_path / "run-1")
    identities = PartTable.of([(part.source, 0) for part in parts])
    order.order_bucket(sources, identities, 0, 0, True, 64, 2, tmp_path / "bucket")
    with pytest.raises(IntegrityError, match="bucket entries object cannot be merged"):
        merge.merge_runs([sources[0], (tmp_path / "bucket", 1)], tmp_path / "run-2")
    merge.merge_runs(sources, tmp_path / "run")
    truncated = tmp_path / "run-cut"
    truncated.write_bytes((tmp_path / "run").read_bytes()[:-5])
    with pytest.raises(IntegrityError):
        order.gather_bucket([(truncated, 0)], 0, 0)



def test_an_entry_naming_a_part_the_table_lacks_is_refused(tmp_path: Path) -> None:
    """An order task given fewer parts' identities than its entries name fails closed (before: a
    numpy IndexError, a traceback)."""
    parts = [_part(tmp_path, f"p{index}", [(index * 100 + doc, 2) for doc in range(30)]) for index in range(3)]
    sources = _part_entries(tmp_path, parts)
    short = PartTable.of([(part.source, 0) for part in parts[:2]])
    with pytest.raises(IntegrityError, match="names part 2, but the corpus has 2 parts"):
        order.order_bucket(sources, short, 0, 0, True, 64, 2, tmp_path / "bucket")
