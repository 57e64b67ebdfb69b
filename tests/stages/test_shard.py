"""Shard assembly: the chunked, gathered writers give exactly the bytes of the formats' own
sequential writers, for any chunk size, shard size and bucket count."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep import hashing
from prep.errors import IntegrityError
from prep.formats import megatron, wds
from prep.inputs.metadata import metadata_json
from prep.stages import gather, order, shard
from prep.stages.cuts import plan_shards
from prep.stages.members import PartNames, document_ids, document_metadata, sample_jsons
from prep.stages.specs import Part, PartTable
from prep.workfiles import entries as entry_objects
from prep.workfiles import keys
from prep.workfiles.docnames import document_id, record_line
from prep.workfiles.intermediate import IntermediateWriter, read_columns
from prep.workfiles.shardplan import ShardPlan

DTYPE = np.dtype(np.uint16)
EOS = 7
SEED = 11

_documents = st.lists(st.tuples(st.text(max_size=40), st.lists(st.integers(0, 65535), max_size=30)),
                      min_size=1, max_size=8)


def _write_part(folder: Path, name: str, docs: list[tuple[str, list[int]]], with_ids: bool,
                keyed: bool = False) -> Part:
    """An intermediate of two batches, laid out in the route seed's key order when `keyed` (as
    tokenize writes them), else in input order."""
    path = folder / f"{name}.part"
    texts = [text.encode("utf-8", "surrogatepass") for text, _ in docs]
    hashes = [index.to_bytes(8, "little") + name.encode().ljust(8, b"_")[:8] for index in range(len(docs))]
    with IntermediateWriter(path, DTYPE, order_seed=SEED if keyed else None) as writer:
        half = len(docs) // 2  # two batches, so offsets span batches
        for rows in (range(half), range(half, len(docs))):
            writer.write_batch(list(rows), [f"{name}-{i}" if with_ids else None for i in rows],
                               [texts[i] for i in rows], [hashes[i] for i in rows], [False] * len(rows),
                               [np.asarray(docs[i][1], DTYPE) for i in rows])
    return Part(path, f"{name}.jsonl", "jsonl", 3, len(docs))


def _shards(folder: Path, parts: list[Part], shard_size: int, bits: int, exact: bool = True
            ) -> tuple[list[ShardPlan], dict[int, Path]]:
    """Order and cut `parts` as a build does, into `2**bits` buckets, from their entries."""
    routes = []
    for ordinal, part in enumerate(parts):
        path = folder / f"entries-{ordinal}"
        entry_objects.write_part_entries(path, read_columns(part.path, entry_objects.PART_COLUMNS), SEED)
        routes.append((path, ordinal))
    identities = PartTable.of([(part.source, part.line_offset) for part in parts])
    summaries, buckets = [], {}
    for bucket in range(1 << bits):
        buckets[bucket] = folder / f"bucket-{bucket}"
        summaries.append(order.order_bucket(routes, identities, bucket, bits, exact, shard_size, DTYPE.itemsize,
                                            buckets[bucket])[1])
    return plan_shards(summaries, bits, shard_size), buckets


@settings(max_examples=25, deadline=None)
@given(parts=st.lists(_documents, min_size=1, max_size=3), shard_size=st.integers(2, 200),
       chunk=st.integers(1, 3000), bits=st.integers(0, 2), with_ids=st.booleans(), window=st.integers(1, 5),
       payload=st.integers(1, 400), stage=st.integers(1, 300), gap=st.integers(0, 64), direct=st.integers(1, 64),
       keyed=st.booleans())
def test_units_equal_the_sequential_writers(parts: list[list[tuple[str, list[int]]]], shard_size: int, chunk: int,
                                            bits: int, with_ids: bool, window: int, payload: int, stage: int,
                                            gap: int, direct: int, keyed: bool) -> None:
    texts = [text for part in parts for text, _ in part]
    if any("\ud800" <= c <= "\udfff" for text in texts for c in text):
        return  # inputs never hold lone surrogates (the read stage refuses them)
    with tempfile.TemporaryDirectory() as name, pytest.MonkeyPatch.context() as patch:
        patch.setattr(shard, "CHUNK_BYTES", chunk)
        patch.setattr(gather, "MAX_OPEN_FILES", 1)
        patch.setattr(shard, "WINDOW_DOCUMENTS", window)
        patch.setattr(shard, "PAYLOAD_BYTES", payload)
        patch.setattr(gather, "STAGE_BYTES", stage)
        patch.setattr(gather, "MERGE_GAP", gap)
        patch.setattr(gather, "DIRECT_BYTES", direct)  # spans this large go straight to their place
        folder = Path(name)
        written = [_write_part(folder, f"p{i}", docs, with_ids, keyed) for i, docs in enumerate(parts)]
        plans, buckets = _shards(folder, written, shard_size, bits)
        reader = gather.PartReader([part.path for part in written])
        hashes = {(n, r): np.frombuffer(r.to_bytes(8, "little") + f"p{n}".encode().ljust(8, b"_")[:8], "<u8")
                  for n, docs in enumerate(parts) for r in range(len(docs))}
        try:
            for plan in plans:
                documents = shard.collect_shard(plan, buckets, PartNames.of_parts(written), with_json=True)
                out = folder / f"out-{plan.name}"
                out.mkdir()
                files = {**shard.write_unit("bin", plan, documents, reader, DTYPE, EOS, out),
                         **shard.write_unit("wds", plan, documents, reader, DTYPE, EOS, out)}
                windows = list(documents.windows())
                assert all(0 < len(w.part) <= window for w in windows)
                members = [(int(p), int(r)) for p, r in zip(np.concatenate([w.part for w in windows] or [np.zeros(0, np.int64)]),
                                                            _rows(plan, buckets))]
                sequences = [np.asarray([*parts[n][r][1], EOS], DTYPE) for n, r in members]
                megatron.write_dataset(folder / f"expected-{plan.name}", sequences, DTYPE)
                assert files["bin"].path.read_bytes() == megatron.bin_path(folder / f"expected-{plan.name}").read_bytes()
                assert files["idx"].path.read_bytes() == megatron.idx_path(folder / f"expected-{plan.name}").read_bytes()
                samples = []
                for n, r in members:
                    part = written[n]
                    line = record_line(part.format, part.line_offset, r)
                    doc_id = document_id(f"p{n}-{r}" if with_ids else None, part.source, line)
                    hi, lo = keys.order_keys(hashes[n, r].reshape(1, 2), SEED)
                    samples.append(wds.Sample(wds.order_key_name(int(hi[0]), int(lo[0])),
                                              wds.sample_json(doc_id, part.source, line, len(parts[n][r][1]) + 1),
                                              wds.npy_bytes(np.asarray([*parts[n][r][1], EOS], DTYPE)),
                                              parts[n][r][0].encode("utf-8")))
                wds.write_shard(folder / f"expected-{plan.name}.tar", samples)
                assert files["wds"].path.read_bytes() == (folder / f"expected-{plan.name}.tar").read_bytes()
                for file in files.values():
                    assert file.digest == hashing.digest_file(file.path)
        finally:
            reader.close()


class _CountingReader(gather.PartReader):
    reads = 0

    def read_into(self, part: int, offset: int, view: memoryview) -> None:
        self.reads += 1
        super().read_into(part, offset, view)


@pytest.mark.parametrize("unit", ["bin", "wds"])
def test_a_window_reads_one_run_per_intermediate_batch_when_keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   unit: str) -> None:
    """With tokenize's layout (each batch in key order), a shard's documents are one run of tokens
    (and one of text) per intermediate batch, however thinly they are spread over the parts; in
    input order the same shards cost about a read per document (no gap is read through here)."""
    monkeypatch.setattr(gather, "MERGE_GAP", 0)
    rng = np.random.default_rng(5)
    corpus = [[(f"text {p} {i} " + "x" * int(rng.integers(0, 30)), rng.integers(0, 65535, int(rng.integers(1, 12))).tolist())
               for i in range(1500)] for p in range(6)]
    reads: dict[bool, int] = {}
    for keyed in (True, False):
        folder = tmp_path / str(keyed)
        folder.mkdir()
        parts = [_write_part(folder, f"p{n}", docs, False, keyed) for n, docs in enumerate(corpus)]
        plans, buckets = _shards(folder, parts, 20_000, 2)
        reader = _CountingReader([part.path for part in parts])
        for plan in plans:
            (folder / plan.name).mkdir()
            documents = shard.collect_shard(plan, buckets, PartNames.of_parts(parts), unit == "wds")
            shard.write_unit(unit, plan, documents, reader, DTYPE, EOS, folder / plan.name)
        reader.close()
        reads[keyed] = reader.reads
    assert len(plans) >= 8
    runs_per_shard = len(corpus) * 2 * (2 if unit == "wds" else 1)  # two batches a part; tokens, and text for wds
    assert reads[True] <= len(plans) * runs_per_shard
    assert reads[False] > 10 * reads[True]


def _rows(plan: ShardPlan, buckets: dict[int, Path]) -> list[int]:
    rows: list[int] = []
    for bucket, first, count in plan.slices:
        rows.extend(entry_objects.EntryFile.open(buckets[bucket]).read(first, count)[0]["row"].tolist())
    return rows


def _reference_jsons(entries: np.ndarray, ids: bytes, parts: list[Part]) -> list[bytes]:
    """Each document's `.json` member, one `wds.sample_json` per document (what shard used to do)."""
    view = memoryview(ids)
    found = []
    for part, row, id_offset, id_len, tokens in zip(entries["part"].tolist(), entries["row"].tolist(),
                                                   entries["id_offset"].tolist(), entries["id_len"].tolist(),
                                                   entries["n_tokens"].tolist()):
        source = parts[part]
        line = record_line(source.format, source.line_offset, row)
        raw = bytes(view[id_offset:id_offset + id_len])
        doc_id = None if id_len == entry_objects.NO_ID else raw.decode("utf-8", "surrogatepass")
        found.append(wds.sample_json(document_id(doc_id, source.source, line), source.source, line, tokens + 1))
    return found


_json_ids = st.lists(st.one_of(st.none(), st.text(st.characters(blacklist_categories=["Cs"]), max_size=10)),
                     min_size=1, max_size=30)


@given(_json_ids, st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=8), min_size=1, max_size=3),
       st.integers(0, 10**12), st.data())
@settings(max_examples=80, deadline=None)
def test_vectorized_json_members_equal_the_reference(ids: list[str | None], sources: list[str], line_offset: int,
                                                     data: st.DataObject) -> None:
    """`.json` members built with numpy are the bytes of one `wds.sample_json` per document:
    ids with quotes, backslashes or control characters, missing ids, any source and line; the
    ids alone (MDS samples) are the ids those members name."""
    parts = [Part(Path("unused"), source, "jsonl", line_offset, len(ids)) for source in sources]
    encoded = [b"" if doc_id is None else doc_id.encode() for doc_id in ids]
    entries = np.zeros(len(ids), dtype=entry_objects.ENTRY_DTYPE)
    entries["part"] = data.draw(st.lists(st.integers(0, len(sources) - 1), min_size=len(ids), max_size=len(ids)))
    entries["row"] = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=len(ids), max_size=len(ids)))
    entries["n_tokens"] = data.draw(st.lists(st.integers(0, 10**9), min_size=len(ids), max_size=len(ids)))
    entries["id_offset"] = np.cumsum([0] + [len(e) for e in encoded])[:-1] + 3
    entries["id_len"] = [entry_objects.NO_ID if doc_id is None else len(e) for doc_id, e in zip(ids, encoded)]
    blob = b"pad" + b"".join(encoded)
    members, offsets = sample_jsons(entries, blob, PartNames.of_parts(parts))
    got = [members[offsets[k]:offsets[k + 1]] for k in range(len(ids))]
    assert got == _reference_jsons(entries, blob, parts)
    named, named_offsets = document_ids(entries, blob, PartNames.of_parts(parts))
    assert [named[named_offsets[k]:named_offsets[k + 1]].decode() for k in range(len(ids))] == [
        json.loads(member)["id"] for member in got]


@given(st.lists(st.integers(0, 2**63 - 1), max_size=20))
def test_decimal_digits_and_npy_headers(values: list[int]) -> None:
    """Digits and widths are `str`'s; vectorized .npy headers are `wds.npy_header`'s."""
    digits, widths = wds.decimal_digits(values)
    assert [row[20 - width:].tobytes().decode() for row, width in zip(digits, widths)] == [str(v) for v in values]
    headers = wds.npy_headers(values, DTYPE)
    assert [row.tobytes() for row in headers] == [wds.npy_header(v, DTYPE) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 5, 2**64 - 1])), max_size=40), st.integers(1, 7))
def test_copy_numbers_continue_across_windows(keys: list[tuple[int, int]], window: int) -> None:
    """With dedup off, the k-th further copy of a key gets low half + k (wrapping), whether or not
    its run of copies crosses a window boundary: windows give the whole shard's sample keys."""
    entries = np.zeros(len(keys), dtype=entry_objects.ENTRY_DTYPE)
    entries["key_hi"] = [hi for hi, _ in keys]
    entries["key_lo"] = [lo for _, lo in keys]
    expected, previous, copy = [], None, 0
    for key in keys:
        copy = copy + 1 if key == previous else 0
        expected.append((key[1] + copy) % 2**64)
        previous = key
    carry = None
    found: list[int] = []
    for low in range(0, len(keys), window):
        key_lo, carry = shard._sample_key_lo(entries[low:low + window], carry)
        found.extend(key_lo.tolist())
    assert found == expected


def test_gather_reads_neighbouring_spans_together_and_refuses_a_short_file(tmp_path: Path) -> None:
    """Spans land at their targets in any order, across files, merged or not; a file cut short
    is refused, not zero-filled."""
    data = bytes(range(256)) * 4
    paths = [tmp_path / "a", tmp_path / "b"]
    paths[0].write_bytes(data)
    paths[1].write_bytes(data[::-1])
    reader = gather.PartReader(paths)
    spans = [(0, 1000, 6), (1, 3, 5), (0, 10, 5), (0, 15, 3), (1, 0, 0), (0, 0, 2)]
    try:
        for gap, stage, direct in ((0, 1, 1 << 20), (8, 4, 1 << 20), (4096, 1 << 20, 1 << 20), (8, 4, 4), (0, 1, 1)):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(gather, "MERGE_GAP", gap)
                patch.setattr(gather, "STAGE_BYTES", stage)
                patch.setattr(gather, "DIRECT_BYTES", direct)
                out = np.zeros(21, dtype=np.uint8)
                part, offset, size = (np.asarray(column, dtype=np.int64) for column in zip(*spans))
                reader.gather(out, part, offset, size, np.cumsum(size) - size)
                sources = [data, data[::-1]]
                assert out.tobytes() == b"".join(sources[p][o:o + n] for p, o, n in spans)
        for direct in (1 << 20, 1):
            with pytest.MonkeyPatch.context() as patch, pytest.raises(IntegrityError, match="shorter than its metadata"):
                patch.setattr(gather, "DIRECT_BYTES", direct)
                reader.gather(np.zeros(8, dtype=np.uint8), *[np.asarray([v], dtype=np.int64) for v in (0, 1020, 8, 0)])
    finally:
        reader.close()


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 70), max_size=12), width=st.sampled_from([8, 16, 512]),
       column=st.integers(0, 7), seed=st.integers(0, 1000))
def test_scatter_blocks_places_pieces_and_zeroes_their_last_rows(lengths: list[int], width: int, column: int,
                                                                 seed: int) -> None:
    """Each piece lands from `column` of its first row on; the rest of its last row is zero;
    rows no piece reaches keep their bytes, and so do bytes before `column` of rows without a piece."""
    rng = np.random.default_rng(seed)
    data = rng.integers(1, 256, size=sum(lengths), dtype=np.uint8)
    spans = [-(-(column + length) // width) if length or column else 0 for length in lengths]
    order = rng.permutation(len(lengths))
    rows = np.zeros(len(lengths), dtype=np.int64)
    at = 1
    for index in order.tolist():  # the pieces, in other rows than their order, a spare row between
        rows[index] = at
        at += spans[index] + 1
    before = rng.integers(1, 256, size=(at, width), dtype=np.uint8)
    blocks = before.copy()
    sources = np.cumsum(lengths) - np.asarray(lengths, dtype=np.int64) if lengths else np.zeros(0, np.int64)
    gather.scatter_blocks(blocks, rows, column, data, sources, np.asarray(lengths, dtype=np.int64))
    touched = np.zeros(at, dtype=bool)
    for row, source, length, span in zip(rows.tolist(), sources.tolist(), lengths, spans):
        if not span:
            continue
        flat = blocks[row:row + span].reshape(-1)
        assert flat[column:column + length].tobytes() == data[source:source + length].tobytes()
        assert not flat[column + length:].any()
        touched[row:row + span] = True
    assert np.array_equal(blocks[~touched], before[~touched])


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), max_size=12), align=st.sampled_from([1, 2, 4, 8]),
       odd=st.integers(0, 7), seed=st.integers(0, 1000))
def test_place_copies_spans_in_the_widest_common_unit(sizes: list[int], align: int, odd: int, seed: int) -> None:
    """`gather.place` equals a byte-by-byte copy whatever the spans' common alignment (token ids
    of 2 or 4 bytes, texts of any size), in buffers whose length is no multiple of it; bytes no
    span targets keep their values."""
    rng = np.random.default_rng(seed)
    lengths = [size * align for size in sizes]
    if lengths and odd:
        lengths[int(rng.integers(len(lengths)))] += odd  # one span breaks the alignment: bytes again
    gaps = rng.integers(0, 3, size=len(lengths)) * align
    sources = np.cumsum(np.asarray(lengths, dtype=np.int64) + gaps) - lengths if lengths else np.zeros(0, np.int64)
    source = rng.integers(0, 256, size=int(sources[-1] + lengths[-1]) + odd + 3 if lengths else 3, dtype=np.uint8)
    order = rng.permutation(len(lengths))
    targets = np.zeros(len(lengths), dtype=np.int64)
    at = align
    for index in order.tolist():
        targets[index] = at
        at += lengths[index] + align * int(rng.integers(0, 2))
    out = rng.integers(0, 256, size=at + 5, dtype=np.uint8)
    expected = out.copy()
    for target, start, length in zip(targets.tolist(), sources.tolist(), lengths):
        expected[target:target + length] = source[start:start + length]
    gather.place(out, targets, source, sources, np.asarray(lengths, dtype=np.int64))
    assert out.tobytes() == expected.tobytes()


_json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False,
                                                                                                allow_infinity=False)
                            | st.text(st.characters(blacklist_categories=["Cs"]), max_size=6),
                            lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(st.characters(blacklist_categories=["Cs"]), max_size=4), inner,
                                              max_size=3), max_leaves=8)
_records = st.lists(st.dictionaries(st.sampled_from(["url", "license", "source", "other"]), _json_values, max_size=4),
                    min_size=1, max_size=20)


@given(_records, st.data())
@settings(max_examples=80, deadline=None)
def test_json_members_carry_each_documents_metadata(records: list[dict[str, object]], data: st.DataObject) -> None:
    """With metadata, each `.json` member is `wds.sample_json` with the document's metadata
    nested under "metadata" (quotes, backslashes, non-ASCII, nesting, numbers, nulls), still
    canonical: its bytes are json.dumps of what it reads as, keys sorted, compact, UTF-8; the
    metadata read back from the entries is the documents' own."""
    fields = ("url", "license", "source")
    metadata = [metadata_json(record, fields) for record in records]
    ids = data.draw(st.lists(st.one_of(st.none(), st.text(st.characters(blacklist_categories=["Cs"]), max_size=5)),
                             min_size=len(records), max_size=len(records)))
    spans = [(b"" if doc_id is None else doc_id.encode()) + meta for doc_id, meta in zip(ids, metadata)]
    entries = np.zeros(len(records), dtype=entry_objects.ENTRY_DTYPE)
    entries["id_offset"] = np.cumsum([0] + [len(span) for span in spans])[:-1]
    entries["id_len"] = [entry_objects.NO_ID if doc_id is None else len(doc_id.encode()) for doc_id in ids]
    entries["meta_len"] = [len(meta) for meta in metadata]
    entries["n_tokens"] = np.arange(len(records))
    blob, parts = b"".join(spans), [Part(Path("unused"), "a.jsonl", "jsonl", 0, len(records))]
    members, offsets = sample_jsons(entries, blob, PartNames.of_parts(parts), with_metadata=True)
    got = [members[offsets[k]:offsets[k + 1]] for k in range(len(records))]
    for k, (member, record, doc_id, meta) in enumerate(zip(got, records, ids, metadata)):
        line = record_line("jsonl", 0, 0)
        assert member == wds.sample_json(document_id(doc_id, "a.jsonl", line), "a.jsonl", line, k + 1, meta)
        read = json.loads(member)
        assert read["metadata"] == {key: value for key, value in record.items() if key in fields and value is not None}
        assert member == json.dumps(read, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    found, bounds = document_metadata(entries, blob)
    assert [found[bounds[k]:bounds[k + 1]] for k in range(len(records))] == metadata
