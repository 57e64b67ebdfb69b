"""Shard assembly: write planned shards in both formats.

Streams intermediates in input order, reading only the record batches that hold documents of
the wanted shards, and writes each document at the offset the plan fixed (positional writes),
so memory holds one batch at a time and output bytes never depend on how the work is split:
one task may write a group of shards, or several tasks may each scatter a range of the
intermediates into the same shard files before one task finishes them.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prep.faults import crash_point
from prep.formats import little_endian, megatron, wds
from prep.stages.intermediate import Intermediate
from prep.stages.shuffle import Part, ShardSpec, document_id, record_line


@dataclass(frozen=True)
class ShardFiles:
    """Local files of one shard, by artifact format (bin, idx, wds)."""

    index: int
    files: dict[str, Path]


def create_shard_files(spec: ShardSpec, formats: tuple[str, ...], work_dir: Path) -> ShardFiles:
    """Empty files of the shard's final sizes (sparse), ready for positional writes."""
    stem = work_dir / f"shard-{spec.index:05d}-{uuid.uuid4().hex}"
    files: dict[str, Path] = {}
    for fmt, suffix, size in (("bin", ".bin", spec.bin_size), ("wds", ".tar", spec.tar_size)):
        if fmt in formats:
            files[fmt] = stem.with_suffix(suffix)
            with open(files[fmt], "xb") as handle:
                handle.truncate(size)
    if "bin" in formats:
        files["idx"] = stem.with_suffix(".idx")
    return ShardFiles(spec.index, files)


class _OpenShard:
    """File descriptors of one shard's files, open for positional writes."""

    def __init__(self, spec: ShardSpec, files: ShardFiles) -> None:
        self.spec = spec
        self.fds = {fmt: os.open(path, os.O_WRONLY) for fmt, path in files.files.items() if fmt != "idx"}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def scatter(parts: list[Part], keep: np.ndarray, plan: np.ndarray, specs: list[ShardSpec],
            files: dict[int, ShardFiles], dtype: np.dtype[Any], eos_id: int, part_range: range) -> None:
    """Write every kept document of `parts[part_range]` that belongs to one of `specs` at its
    planned offsets. Ranges of parts may be scattered by different processes into the same
    files: their documents never overlap."""
    wanted = np.zeros(int(plan["shard"].max()) + 1 if len(plan) else 0, dtype=bool)
    wanted[[spec.index for spec in specs]] = True
    opened = {spec.index: _OpenShard(spec, files[spec.index]) for spec in specs}
    eos = np.array([eos_id], dtype=dtype)
    try:
        kept_index = np.cumsum(keep) - 1  # document index -> plan row (valid where kept)
        offset = 0
        for number, part in enumerate(parts):
            part_keep = keep[offset:offset + part.documents]
            part_plan_rows = kept_index[offset:offset + part.documents]
            offset += part.documents
            if number not in part_range:
                continue
            mine = part_keep.copy()
            mine[part_keep] = wanted[plan["shard"][part_plan_rows[part_keep]]]
            if mine.any():
                _scatter_part(part, mine, part_plan_rows, plan, opened, dtype, eos)
    finally:
        for shard in opened.values():
            shard.close()


def finish_shard(spec: ShardSpec, files: ShardFiles, plan: np.ndarray, dtype: np.dtype[Any]) -> ShardFiles:
    """Complete a scattered shard: the tar's end-of-archive blocks, and the .idx, whose sequence
    lengths follow from the plan's .bin offsets (so scatterers need not report them)."""
    if "wds" in files.files:
        with open(files.files["wds"], "r+b") as handle:
            handle.seek(spec.tar_size - len(wds.END_OF_ARCHIVE))
            handle.write(wds.END_OF_ARCHIVE)
    if "idx" in files.files:
        rows = np.flatnonzero(plan["shard"] == spec.index)
        offsets = np.sort(plan["bin_off"][rows])
        lengths = np.diff(np.append(offsets, spec.bin_size)) // dtype.itemsize
        megatron.write_index(files.files["idx"], lengths.astype(np.int32), dtype)
    return files


def assemble_shards(parts: list[Part], keep: np.ndarray, plan: np.ndarray, shards: list[ShardSpec],
                    formats: tuple[str, ...], dtype: np.dtype[Any], eos_id: int, work_dir: Path) -> list[ShardFiles]:
    """Write the given shards completely in this process."""
    files = {spec.index: create_shard_files(spec, formats, work_dir) for spec in shards}
    scatter(parts, keep, plan, shards, files, dtype, eos_id, range(len(parts)))
    return [finish_shard(spec, files[spec.index], plan, dtype) for spec in shards]


def _scatter_part(part: Part, mine: np.ndarray, plan_rows: np.ndarray, plan: np.ndarray,
                  opened: dict[int, _OpenShard], dtype: np.dtype[Any], eos: np.ndarray) -> None:
    """Write this part's selected documents at their planned offsets, batch by batch."""
    counts = Intermediate(part.path, ["n_tokens"])
    full = Intermediate(part.path, ["row", "id", "text", "tokens"])
    first = 0
    for group in range(counts.num_batches):
        rows = counts.batch(group).num_rows
        selected = np.flatnonzero(mine[first:first + rows])
        if len(selected):
            _write_batch(part, full.batch(group), selected, plan[plan_rows[first + selected]], opened, dtype, eos)
        first += rows


def _write_batch(part: Part, batch: pa.RecordBatch, selected: np.ndarray, entries: np.ndarray,
                 opened: dict[int, _OpenShard], dtype: np.dtype[Any], eos: np.ndarray) -> None:
    """One pwritev per document and format, straight from the batch's buffers: neither token
    ids nor texts are copied, and tar headers are made for the whole batch at once."""
    little = little_endian(dtype)
    eos_bytes = eos.astype(little).tobytes()
    tokens = batch.column("tokens")
    token_bytes = memoryview(tokens.values.to_numpy(zero_copy_only=False).astype(little, copy=False)).cast("B")
    token_offsets = tokens.offsets.to_numpy() * little.itemsize
    texts = batch.column("text")
    text_offsets = np.frombuffer(texts.buffers()[1], dtype=np.int64, count=len(texts) + 1, offset=texts.offset * 8)
    text_data = memoryview(texts.buffers()[2] or b"")
    token_views = [token_bytes[token_offsets[i]:token_offsets[i + 1]] for i in selected.tolist()]
    lengths = [len(view) // little.itemsize + 1 for view in token_views]
    shards = [opened[index] for index in entries["shard"].tolist()]
    if "bin" in shards[0].fds:
        for shard, view, offset in zip(shards, token_views, entries["bin_off"].tolist()):
            os.pwritev(shard.fds["bin"], [view, eos_bytes], offset)
    if "wds" in shards[0].fds:
        ids, record_rows = batch.column("id").to_pylist(), batch.column("row").to_pylist()
        jsons = []
        for i, length in zip(selected.tolist(), lengths):
            line = record_line(part.format, part.line_offset, record_rows[i])
            jsons.append(wds.sample_json(document_id(ids[i], part.source, line), part.source, line, length))
        text_views = [text_data[text_offsets[i]:text_offsets[i + 1]] for i in selected.tolist()]
        buffer_lists = wds.sample_buffer_lists(entries["pos"], jsons, [[v, eos_bytes] for v in token_views],
                                               text_views, little)
        for shard, buffers, offset in zip(shards, buffer_lists, entries["tar_off"].tolist()):
            os.pwritev(shard.fds["wds"], buffers, offset)
    crash_point("shard.mid_write")
