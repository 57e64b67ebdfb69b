"""Shard assembly: the chunked, gathered writers give exactly the bytes of the formats' own
sequential writers, for any chunk size, shard size and set of dropped documents."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.formats import megatron, wds
from prep.stages import shard
from prep.stages.intermediate import IntermediateWriter
from prep.stages.shuffle import document_id, plan_shards, record_line
from prep.stages.specs import Part

DTYPE = np.dtype(np.uint16)
EOS = 7

_documents = st.lists(st.tuples(st.text(max_size=40), st.lists(st.integers(0, 65535), max_size=30)),
                      min_size=1, max_size=8)


def _write_part(folder: Path, name: str, docs: list[tuple[str, list[int]]], with_ids: bool) -> Part:
    path = folder / f"{name}.part"
    texts = [text.encode("utf-8", "surrogatepass") for text, _ in docs]
    hashes = [index.to_bytes(8, "little") + name.encode().ljust(8, b"_")[:8] for index in range(len(docs))]
    with IntermediateWriter(path, DTYPE) as writer:
        half = len(docs) // 2  # two batches, so offsets span batches
        for rows in (range(half), range(half, len(docs))):
            writer.write_batch(list(rows), [f"{name}-{i}" if with_ids else None for i in rows],
                               [texts[i] for i in rows], [hashes[i] for i in rows], [False] * len(rows),
                               [np.asarray(docs[i][1], DTYPE) for i in rows])
    return Part(path, f"{name}.jsonl", "jsonl", 3, len(docs))


@settings(max_examples=25, deadline=None)
@given(parts=st.lists(_documents, min_size=1, max_size=3), shard_size=st.integers(2, 200),
       chunk=st.integers(1, 3000), drop_every=st.integers(0, 3), with_ids=st.booleans())
def test_units_equal_the_sequential_writers(parts: list[list[tuple[str, list[int]]]], shard_size: int, chunk: int,
                                            drop_every: int, with_ids: bool) -> None:
    texts = [text for part in parts for text, _ in part]
    if any("\ud800" <= c <= "\udfff" for text in texts for c in text):
        return  # inputs never hold lone surrogates (the read stage refuses them)
    with tempfile.TemporaryDirectory() as name, pytest.MonkeyPatch.context() as patch:
        patch.setattr(shard, "CHUNK_BYTES", chunk)
        patch.setattr(shard, "MAX_OPEN_FILES", 1)
        folder = Path(name)
        written = [_write_part(folder, f"p{i}", docs, with_ids) for i, docs in enumerate(parts)]
        flat = [(index, number, row, text, tokens) for index, (number, row, text, tokens) in enumerate(
            (n, r, t, k) for n, docs in enumerate(parts) for r, (t, k) in enumerate(docs))]
        keep = np.ones(len(flat), dtype=bool)
        if drop_every:
            keep[::drop_every + 1] = False
        if not keep.any():
            return
        plan, specs = plan_shards(written, keep, 11, shard_size, DTYPE, ("bin", "wds"))
        documents = shard.collect_documents(written, keep, plan, [spec.index for spec in specs], with_json=True)
        reader = shard.PartReader(written)
        kept = [doc for doc, wanted in zip(flat, keep) if wanted]
        try:
            for spec in specs:
                members = sorted((int(plan["pos"][i]), doc) for i, doc in enumerate(kept)
                                 if plan["shard"][i] == spec.index)
                out = folder / f"out-{spec.index}"
                out.mkdir()
                files = {**shard.write_unit("bin", spec, documents[spec.index], reader, DTYPE, EOS, out),
                         **shard.write_unit("wds", spec, documents[spec.index], reader, DTYPE, EOS, out)}
                sequences = [np.asarray([*tokens, EOS], DTYPE) for _, (_, _, _, _, tokens) in members]
                megatron.write_dataset(folder / f"expected-{spec.index}", sequences, DTYPE)
                assert files["bin"][0].read_bytes() == megatron.bin_path(folder / f"expected-{spec.index}").read_bytes()
                assert files["idx"][0].read_bytes() == megatron.idx_path(folder / f"expected-{spec.index}").read_bytes()
                samples = []
                for position, (_, number, row, text, tokens) in members:
                    part = written[number]
                    line = record_line(part.format, part.line_offset, row)
                    doc_id = document_id(f"p{number}-{row}" if with_ids else None, part.source, line)
                    samples.append(wds.Sample.build(position, doc_id, part.source, line, np.asarray([*tokens, EOS], DTYPE), text))
                wds.write_shard(folder / f"expected-{spec.index}.tar", samples)
                assert files["wds"][0].read_bytes() == (folder / f"expected-{spec.index}.tar").read_bytes()
                for path, digest in files.values():
                    assert digest.size == path.stat().st_size
        finally:
            reader.close()
