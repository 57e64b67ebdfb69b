"""Properties of the partitioned order: keys are a bijection of text hashes, exact dedup keeps the
first copy in input order, every kept document lands in exactly one shard in key order, and the
shards are content-defined: the same whatever the bucket count, and an edit changes only the
shards whose key ranges hold it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.stages import order
from prep.stages.cuts import bucket_bits, plan_shards
from prep.stages.specs import Part, PartTable
from prep.workfiles import entries as entry_objects
from prep.workfiles import keys
from prep.workfiles.intermediate import IntermediateWriter, read_columns
from prep.workfiles.shardplan import ShardPlan

DTYPE = np.dtype(np.uint16)


def _part(folder: Path, name: str, docs: list[tuple[int, int]]) -> Part:
    """An intermediate with one document per (hash seed, token count); equal seeds are equal texts."""
    texts = [f"text-{h}".encode() for h, _ in docs]
    hashes = [h.to_bytes(8, "little") + (h * 7919).to_bytes(8, "little") for h, _ in docs]
    path = folder / f"{name}.part"
    with IntermediateWriter(path, DTYPE) as writer:
        writer.write_batch(range(len(docs)), [None] * len(docs), texts, hashes, [False] * len(docs),
                           [np.zeros(n, DTYPE) for _, n in docs])
    return Part(path, f"{name}.jsonl", "jsonl", 0, len(docs))


def _plan(folder: Path, parts: list[Part], bits: int, shard_size: int, seed: int = 5,
          exact: bool = True) -> tuple[list[ShardPlan], list[dict[str, Any]], dict[int, Path]]:
    routes = []
    for ordinal, part in enumerate(parts):
        routes.append((folder / f"entries-{bits}-{ordinal}", ordinal))
        entry_objects.write_part_entries(routes[-1][0], read_columns(part.path, entry_objects.PART_COLUMNS), seed)
    identities = PartTable.of([(p.source, p.line_offset) for p in parts])
    summaries, buckets = [], {}
    for bucket in range(1 << bits):
        buckets[bucket] = folder / f"bucket-{bits}-{bucket}"
        summaries.append(order.order_bucket(routes, identities, bucket, bits, exact, shard_size, 2, buckets[bucket])[1])
    return plan_shards(summaries, bits, shard_size), summaries, buckets


def _placed(plans: list[ShardPlan], buckets: dict[int, Path]) -> list[tuple[int, int, int, int]]:
    """(key_hi, key_lo, part, row) of every document of every shard, in shard order."""
    found: list[tuple[int, int, int, int]] = []
    for plan in plans:
        for bucket, first, count in plan.slices:
            entries = entry_objects.EntryFile.open(buckets[bucket]).read(first, count)[0]
            found.extend(zip(entries["key_hi"].tolist(), entries["key_lo"].tolist(), entries["part"].tolist(),
                             entries["row"].tolist()))
    return found


@settings(max_examples=40, deadline=None)
@given(hashes=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), min_size=1, max_size=200,
                       unique=True), seed=st.integers(0, 2**64 - 1))
def test_order_keys_are_a_bijection_of_the_hash(hashes: list[tuple[int, int]], seed: int) -> None:
    hi, lo = keys.order_keys(np.asarray(hashes, dtype=np.uint64), seed)
    assert len(set(zip(hi.tolist(), lo.tolist()))) == len(hashes)
    again = keys.order_keys(np.asarray(hashes, dtype=np.uint64), seed)
    assert (again[0] == hi).all() and (again[1] == lo).all()


_corpora = st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 60)), min_size=0, max_size=30),
                    min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(corpus=_corpora, shard_size=st.integers(2, 400))
def test_every_kept_document_is_placed_once_in_key_order_and_dedup_keeps_the_first(
        corpus: list[list[tuple[int, int]]], shard_size: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        parts = [_part(folder, f"f{i}", docs) for i, docs in enumerate(corpus)]
        plans, summaries, buckets = _plan(folder, parts, 1, shard_size)
        placed = _placed(plans, buckets)
        first: dict[int, tuple[int, int]] = {}
        for number, docs in enumerate(corpus):
            for row, (text, _) in enumerate(docs):
                first.setdefault(text, (number, row))
        assert sorted((p, r) for _, _, p, r in placed) == sorted(first.values())
        assert [(hi, lo) for hi, lo, _, _ in placed] == sorted((hi, lo) for hi, lo, _, _ in placed)
        assert sum(int(s["duplicates_dropped"]) for s in summaries) == sum(map(len, corpus)) - len(first)
        for plan in plans:
            assert plan.bin_size <= shard_size or plan.documents == 1
            assert plan.documents == sum(count for _, _, count in plan.slices)


@settings(max_examples=25, deadline=None)
@given(corpus=_corpora, shard_size=st.integers(2, 400))
def test_shards_do_not_depend_on_the_bucket_count(corpus: list[list[tuple[int, int]]], shard_size: int) -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        parts = [_part(folder, f"f{i}", docs) for i, docs in enumerate(corpus)]
        results = [_plan(folder, parts, bits, shard_size) for bits in (0, 1, 3)]
        described = [[(p.name, p.depth, p.documents, p.bin_size) for p in plans] for plans, _, _ in results]
        assert described[0] == described[1] == described[2]
        placed = [_placed(plans, buckets) for plans, _, buckets in results]
        assert placed[0] == placed[1] == placed[2]


def test_an_added_document_changes_at_most_two_shards(tmp_path: Path) -> None:
    """Content-defined cuts: one more document touches only the shard whose range holds it
    (split in two when it overflows); every other shard keeps its name and digest."""
    rng = np.random.default_rng(3)
    docs = [(int(h), int(n)) for h, n in zip(rng.permutation(5000)[:2000] + 10, rng.integers(5, 60, 2000))]
    def shards(run: str, corpus: list[tuple[int, int]]) -> list[ShardPlan]:
        (tmp_path / run).mkdir()
        return _plan(tmp_path / run, [_part(tmp_path / run, "a", corpus)], 2, 4000)[0]

    before = shards("before", docs)
    for extra in range(20):
        after = shards(f"after-{extra}", [*docs, (6000 + extra, 30)])
        old = {(p.name, p.digest) for p in before}
        new = {(p.name, p.digest) for p in after}
        assert len(new - old) <= 2 and len(old - new) <= 1, extra
    sizes = np.asarray([p.bin_size for p in before])
    assert len(before) > 10 and np.mean((sizes >= 0.4 * 4000) & (sizes <= 4000)) >= 0.9


@pytest.mark.parametrize(("documents", "bits"), [(0, 0), (4_000_000, 0), (4_000_001, 1), (16_000_001, 3),
                                                 (10**13, 20)])
def test_bucket_count_follows_the_document_count(documents: int, bits: int) -> None:
    assert bucket_bits(documents, 4_000_000) == bits


_ids = st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=40)


@given(_ids, st.integers(1, 5))
@settings(max_examples=60, deadline=None)
def test_the_id_column_packs_like_its_strings(ids: list[str | None], pieces: int) -> None:
    """Read from the buffers (nulls, slices, chunks), ids pack to the bytes `_pack_ids` makes."""
    import pyarrow as pa

    from prep.workfiles.columns import string_column, to_strings

    column = string_column(ids)
    cut = len(ids) // pieces
    chunked = pa.chunked_array([column.slice(0, cut), column.slice(cut)], type=pa.string())
    for packed in (column, chunked, column.slice(min(1, len(ids)))):
        offsets, lengths, blob = entry_objects.pack_id_column(packed)
        want_offsets, want_lengths, want_blob = entry_objects._pack_ids(to_strings(packed))
        assert blob == want_blob
        assert np.array_equal(offsets, want_offsets) and np.array_equal(lengths, want_lengths)


@given(st.binary(min_size=1, max_size=60), st.lists(st.tuples(st.integers(0, 59), st.integers(0, 9)), max_size=30))
@settings(max_examples=80, deadline=None)
def test_gather_bytes_equals_slicing(blob: bytes, pairs: list[tuple[int, int]]) -> None:
    """Gathered pieces (contiguous or not, some empty) are the Python slices, concatenated."""
    pairs = [(min(start, len(blob) - 1), min(length, len(blob) - min(start, len(blob) - 1))) for start, length in pairs]
    starts = np.asarray([s for s, _ in pairs], dtype=np.int64)
    lengths = np.asarray([n for _, n in pairs], dtype=np.int64)
    expected = b"".join(blob[s:s + n] for s, n in pairs)
    assert entry_objects.gather_bytes(np.frombuffer(blob, dtype=np.uint8), starts, lengths) == expected
    contiguous = np.cumsum(lengths) - lengths
    if int(lengths.sum()) <= len(blob):
        assert entry_objects.gather_bytes(np.frombuffer(blob, dtype=np.uint8), contiguous, lengths) == blob[:int(lengths.sum())]


@given(blob=st.binary(min_size=1, max_size=80), width=st.integers(1, 9), rows=st.lists(st.integers(0, 20), max_size=30))
@settings(max_examples=80, deadline=None)
def test_gather_bytes_of_fixed_width_pieces_equals_slicing(blob: bytes, width: int, rows: list[int]) -> None:
    """Pieces of one width at multiples of it (fixed-width ids) gather as rows, even past a ragged tail."""
    rows = [row for row in rows if (row + 1) * width <= len(blob)]
    starts = np.asarray(rows, dtype=np.int64) * width
    expected = b"".join(blob[s:s + width] for s in starts.tolist())
    assert entry_objects.gather_bytes(np.frombuffer(blob, dtype=np.uint8), starts, np.full(len(rows), width)) == expected


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2), st.integers(0, 50)), max_size=60))
@settings(max_examples=80, deadline=None)
def test_key_order_equals_the_full_lexsort(rows: list[tuple[int, int, int, int]]) -> None:
    """Sorting by key_hi and then only the tied entries gives the four-key lexsort (many ties)."""
    entries = np.zeros(len(rows), dtype=entry_objects.ENTRY_DTYPE)
    for name, column in zip(("key_hi", "key_lo", "part", "row"), zip(*rows) if rows else ((), (), (), ())):
        entries[name] = column
    expected = np.lexsort((entries["row"], entries["part"], entries["key_lo"], entries["key_hi"]))
    assert np.array_equal(entries[entry_objects.key_order(entries)], entries[expected])


def test_an_order_task_opens_each_part_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header, the two index reads and the bucket's run of a part go through one descriptor:
    an order stage makes parts x buckets reads, so each open counts at scale."""
    import os

    parts = [_part(tmp_path, f"p{index}", [(index * 100 + doc, 2) for doc in range(30)]) for index in range(5)]
    paths = []
    for ordinal, part in enumerate(parts):
        paths.append(tmp_path / f"entries-{ordinal}")
        entry_objects.write_part_entries(paths[-1], read_columns(part.path, entry_objects.PART_COLUMNS), 5)
    opened: list[object] = []
    real_open = os.open

    def counting(path: Any, *args: Any) -> int:
        opened.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", counting)
    gathered, _ = order.gather_bucket([(path, ordinal) for ordinal, path in enumerate(paths)], 1, 2)
    assert sorted(map(str, opened)) == sorted(map(str, paths))
    assert len(gathered) and set(keys.bucket_of(gathered["key_hi"], 2).tolist()) == {1}


def _digest_entries(parts: list[int], rows: list[int], ids: list[bytes | None]) -> tuple[np.ndarray, bytes]:
    """Entries of documents from (part, row) with these ids, keys and sizes made from the row."""
    entries = np.zeros(len(parts), dtype=entry_objects.ENTRY_DTYPE)
    entries["part"], entries["row"] = parts, rows
    entries["key_hi"], entries["key_lo"] = np.asarray(rows) * 7 + 1, np.asarray(rows) * 11 + 2
    entries["n_tokens"], entries["text_bytes"] = np.asarray(rows) % 50 + 1, np.asarray(rows) % 90 + 10
    lengths = [len(i) if i is not None else 0 for i in ids]
    entries["id_len"] = [len(i) if i is not None else entry_objects.NO_ID for i in ids]
    entries["id_offset"] = np.cumsum([0, *lengths[:-1]])
    return entries, b"".join(i for i in ids if i is not None)


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10**6), st.one_of(st.none(), st.binary(max_size=6))),
                min_size=1, max_size=30), st.integers(0, 3))
@settings(max_examples=80, deadline=None)
def test_a_leaf_digest_names_content_not_part_ordinals(docs: list[tuple[int, int, bytes | None]], shift: int) -> None:
    """The digest is the same when other inputs shift the parts' ordinals (a file added before),
    and changes with any one field of any document: key, sizes, line, id, source."""
    sources = [("a.jsonl", 0), ("a.jsonl", 500), ("b.jsonl", 0)]  # a file cut in two parts, and another
    parts, rows, ids = (list(column) for column in zip(*docs))
    entries, blob = _digest_entries(parts, rows, ids)
    digest = order.leaf_digests(entries, blob, PartTable.of(sources), [(0, len(docs))])[0]
    shifted, _ = _digest_entries([p + shift for p in parts], rows, ids)
    others = [(f"new-{i}.jsonl", 0) for i in range(shift)]
    assert order.leaf_digests(shifted, blob, PartTable.of(others + sources), [(0, len(docs))])[0] == digest
    changed: list[tuple[np.ndarray, bytes]] = []
    for name in ("key_hi", "key_lo", "n_tokens", "text_bytes", "row"):
        edited = entries.copy()
        edited[name][-1] += 1
        changed.append((edited, blob))
    moved = entries.copy()
    moved["part"][-1] = 2 if parts[-1] != 2 else 0  # another source (or, from b, a's first part)
    changed.append((moved, blob))
    changed.append(_digest_entries(parts, rows, [*ids[:-1], (ids[-1] or b"") + b"x"]))
    for edited, edited_blob in changed:
        assert order.leaf_digests(edited, edited_blob, PartTable.of(sources), [(0, len(docs))])[0] != digest
