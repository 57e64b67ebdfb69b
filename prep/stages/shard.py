"""Shard assembly: write a group of planned shards in both formats.

Streams every intermediate once, in input order, reading only the row groups that hold
documents of this group, and writes each document at the offset the plan fixed (positional
writes), so memory holds one row group at a time and output bytes never depend on grouping.
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
    """Local files of one assembled shard, by artifact format (bin, idx, wds)."""

    index: int
    files: dict[str, Path]


class _OpenShard:
    def __init__(self, spec: ShardSpec, formats: tuple[str, ...], work_dir: Path) -> None:
        self.spec = spec
        stem = f"shard-{spec.index:05d}-{uuid.uuid4().hex}"
        self.paths: dict[str, Path] = {}
        self.fds: dict[str, int] = {}
        if "bin" in formats:
            self._open("bin", work_dir / f"{stem}.bin", spec.bin_size)
            self.paths["idx"] = work_dir / f"{stem}.idx"
            self.lengths = np.zeros(spec.documents, dtype=np.int32)
        if "wds" in formats:
            self._open("wds", work_dir / f"{stem}.tar", spec.tar_size)

    def _open(self, fmt: str, path: Path, size: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size)
        self.paths[fmt], self.fds[fmt] = path, fd

    def finish(self, dtype: np.dtype[Any]) -> ShardFiles:
        if "wds" in self.fds:
            os.pwrite(self.fds["wds"], wds.END_OF_ARCHIVE, self.spec.tar_size - len(wds.END_OF_ARCHIVE))
        for fd in self.fds.values():
            os.close(fd)  # storing the file fsyncs it (prep.storage)
        if "idx" in self.paths:
            megatron.write_index(self.paths["idx"], self.lengths, dtype)
        return ShardFiles(self.spec.index, dict(self.paths))

    def abort(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        for path in self.paths.values():
            path.unlink(missing_ok=True)


def assemble_shards(parts: list[Part], keep: np.ndarray, plan: np.ndarray, shards: list[ShardSpec],
                    formats: tuple[str, ...], dtype: np.dtype[Any], eos_id: int, work_dir: Path) -> list[ShardFiles]:
    """Write the given shards; `keep` and `plan` cover every document of every part."""
    wanted = np.zeros(int(plan["shard"].max()) + 1 if len(plan) else 0, dtype=bool)
    wanted[[spec.index for spec in shards]] = True
    opened = {spec.index: _OpenShard(spec, formats, work_dir) for spec in shards}
    eos = np.array([eos_id], dtype=dtype)
    try:
        kept_index = np.cumsum(keep) - 1  # document index -> plan row (valid where kept)
        offset = 0
        for part in parts:
            part_keep = keep[offset:offset + part.documents]
            part_plan_rows = kept_index[offset:offset + part.documents]
            offset += part.documents
            mine = part_keep.copy()
            mine[part_keep] = wanted[plan["shard"][part_plan_rows[part_keep]]]
            if not mine.any():
                continue
            _scatter_part(part, mine, part_plan_rows, plan, opened, dtype, eos)
        return [opened[spec.index].finish(dtype) for spec in shards]
    except BaseException:
        for shard in opened.values():
            shard.abort()
        raise


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
        for shard, view, length, offset, position in zip(shards, token_views, lengths, entries["bin_off"].tolist(),
                                                         entries["pos"].tolist()):
            os.pwritev(shard.fds["bin"], [view, eos_bytes], offset)
            shard.lengths[position - shard.spec.first_pos] = length
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
