"""Shard assembly: write each planned shard file front to back, gathering its documents from the
intermediates in shuffled order.

A shard has two units of work, one per format: `bin` (the .bin and .idx) and `wds` (the .tar);
prep/formats/units.py names them and their files.
A unit writes its file sequentially, a chunk of a few MiB at a time: the chunk is laid out in
memory (tar headers for the whole chunk at once), each document's text and token ids are copied
into place with one positional read from its intermediate (usually still in the page cache), then writer
threads append and hash the chunk while the next one is gathered, starting disk writeback at once.
Output files are hashed while written, never read back; memory holds two chunks plus a few dozen
bytes per document of the job's shards.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prep.errors import IntegrityError, StorageIOError
from prep.faults import crash_point
from prep.formats import little_endian, megatron, wds
from prep.formats.units import BIN, IDX, WDS, artifact_format, unit_formats
from prep.hashing import Digest, HashingWriter
from prep.stages.columns import int_column, to_numbers, to_strings
from prep.stages.intermediate import Intermediate
from prep.stages.shuffle import document_id, record_line
from prep.stages.specs import Part, ShardSpec
from prep.writeback import start_writeback

CHUNK_BYTES = 8 << 20
MAX_OPEN_FILES = 256
_GATHER_COLUMNS = ["row", "id", "n_tokens", "text_bytes", "text_offset", "tokens_offset"]


@dataclass(frozen=True)
class ShardDocuments:
    """One shard's documents in position order: where each one's bytes are, and its `.json`."""

    part: np.ndarray  # index into the parts list
    text_offset: np.ndarray
    text_bytes: np.ndarray
    tokens_offset: np.ndarray
    n_tokens: np.ndarray  # without EOS
    jsons: list[bytes]  # empty unless the wds unit needs them


def collect_documents(parts: list[Part], keep: np.ndarray, plan: np.ndarray, shards: list[int],
                      with_json: bool) -> dict[int, ShardDocuments]:
    """One pass over the intermediates' metadata: the documents of `shards`, each in position order."""
    wanted = np.zeros(int(plan["shard"].max()) + 1 if len(plan) else 0, dtype=bool)
    wanted[shards] = True
    kept_index = np.cumsum(keep) - 1  # document index -> plan row (valid where kept)
    columns: dict[str, list[np.ndarray]] = {name: [] for name in ("shard", "pos", "part", "text_offset", "text_bytes",
                                                                  "tokens_offset", "n_tokens")}
    jsons: list[bytes] = []
    first = 0
    for number, part in enumerate(parts):
        table = Intermediate(part.path, _GATHER_COLUMNS).table()
        if table.num_rows != part.documents:
            raise IntegrityError(f"{part.path}: {table.num_rows} documents, the tokenize record says {part.documents}")
        rows = np.arange(first, first + part.documents)
        first += part.documents
        mine = keep[rows].copy()
        mine[mine] = wanted[plan["shard"][kept_index[rows[mine]]]]
        selected = np.flatnonzero(mine)
        if not len(selected):
            continue
        entries = plan[kept_index[rows[selected]]]
        columns["shard"].append(entries["shard"])
        columns["pos"].append(entries["pos"])
        columns["part"].append(np.full(len(selected), number, dtype=np.int32))
        for name in ("text_offset", "text_bytes", "tokens_offset", "n_tokens"):
            columns[name].append(to_numbers(table.column(name))[selected].astype(np.int64))
        if with_json:
            ids = to_strings(table.column("id").take(int_column(selected, pa.int64())))
            record_rows = to_numbers(table.column("row"))[selected].tolist()
            for doc_id, row, n in zip(ids, record_rows, columns["n_tokens"][-1].tolist()):
                line = record_line(part.format, part.line_offset, row)
                jsons.append(wds.sample_json(document_id(doc_id, part.source, line), part.source, line, n + 1))
    if not columns["shard"]:
        return {}
    merged = {name: np.concatenate(arrays) for name, arrays in columns.items()}
    order = np.lexsort((merged["pos"], merged["shard"]))
    result: dict[int, ShardDocuments] = {}
    shard_of = merged["shard"][order]
    for index in shards:
        rows = order[np.searchsorted(shard_of, index, "left"):np.searchsorted(shard_of, index, "right")]
        result[index] = ShardDocuments(
            part=merged["part"][rows], text_offset=merged["text_offset"][rows], text_bytes=merged["text_bytes"][rows],
            tokens_offset=merged["tokens_offset"][rows], n_tokens=merged["n_tokens"][rows],
            jsons=[jsons[i] for i in rows.tolist()] if with_json else [])
    return result


class PartReader:
    """Positional reads from the intermediates, keeping a bounded number of files open.

    Not memory maps: the kernel maps whole large page-cache folios on each fault, so mapped
    intermediates show up as resident memory of the size of the corpus."""

    def __init__(self, parts: list[Part]) -> None:
        self._paths = [part.path for part in parts]
        self._open: OrderedDict[int, int] = OrderedDict()

    def read_into(self, part: int, offset: int, view: memoryview) -> None:
        fd = self._open.get(part)
        if fd is None:
            fd = self._reopen(part)
        count = os.preadv(fd, [view], offset)
        while count < len(view):  # short reads happen only at end of file: a truncated intermediate
            if count <= 0:
                raise IntegrityError(f"{self._paths[part]}: shorter than its metadata says")
            view, offset = view[count:], offset + count
            count = os.preadv(fd, [view], offset)

    def _reopen(self, part: int) -> int:
        if len(self._open) >= MAX_OPEN_FILES:
            os.close(self._open.popitem(last=False)[1])
        fd = self._open[part] = os.open(self._paths[part], os.O_RDONLY)
        return fd

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()


class _ChunkSink:
    """Appends chunks to a new file on one thread and hashes them on another while the caller
    gathers the next chunk (os.pwrite and hashlib release the GIL). Two chunk buffers take
    turns, so memory is two chunks and fresh pages are not faulted in for every chunk.
    Disk writeback of each chunk starts at once; `close` fsyncs. I/O errors name the file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise StorageIOError.from_os_error("creating", path, exc) from exc
        self._hasher = hashlib.sha256()
        self._size = 0
        self._pool = ThreadPoolExecutor(max_workers=2)
        self._pending: list[Future[None]] = []
        self._buffers = [bytearray(CHUNK_BYTES), bytearray(CHUNK_BYTES)]
        self._turn = 0

    def buffer(self, size: int, zeroed: bool) -> memoryview:
        """A buffer of `size` bytes that no write in flight uses (zero-filled when asked)."""
        self._turn ^= 1
        if len(self._buffers[self._turn]) < size:
            self._buffers[self._turn] = bytearray(size)
        elif zeroed:
            np.frombuffer(self._buffers[self._turn], dtype=np.uint8, count=size).fill(0)
        return memoryview(self._buffers[self._turn])[:size]

    def write(self, chunk: memoryview) -> None:
        self._wait()
        offset, self._size = self._size, self._size + len(chunk)
        self._pending = [self._pool.submit(self._hasher.update, chunk),
                         self._pool.submit(self._append, chunk, offset)]
        crash_point("shard.mid_write")

    def _append(self, chunk: memoryview, offset: int) -> None:
        written = 0
        while written < len(chunk):
            written += os.pwrite(self._fd, chunk[written:], offset + written)
        start_writeback(self._fd, offset, len(chunk))

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        except OSError as exc:
            raise StorageIOError.from_os_error("writing", self._path, exc) from exc

    def close(self) -> Digest:
        try:
            self._wait()
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StorageIOError.from_os_error("writing", self._path, exc) from exc
            return Digest(self._hasher.hexdigest(), self._size)
        finally:
            self.abort()

    def abort(self) -> None:
        self._pool.shutdown()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _chunks(spans: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) document ranges of about CHUNK_BYTES of output each (at least one document)."""
    ends = np.cumsum(spans)
    bounds, start = [], 0
    while start < len(spans):
        base = ends[start - 1] if start else 0
        end = max(start + 1, int(np.searchsorted(ends, base + CHUNK_BYTES, "right")))
        bounds.append((start, end))
        start = end
    return bounds


_Fill = Callable[[memoryview, int, int], None]


def _write_chunks(path: Path, spans: np.ndarray, fill: _Fill, zeroed: bool) -> Digest:
    """Write a file of consecutive spans, chunk by chunk; `fill(chunk, start, end)` lays out
    spans [start, end) in a buffer that is zero-filled when `zeroed` (else fully overwritten)."""
    sink = _ChunkSink(path)
    try:
        for start, end in _chunks(spans):
            chunk = sink.buffer(int(spans[start:end].sum()), zeroed)
            try:
                fill(chunk, start, end)
            except OSError as exc:  # reading an intermediate
                raise StorageIOError.from_os_error("reading", exc.filename or f"the intermediates of {path}",
                                                   exc) from exc
            sink.write(chunk)
        return sink.close()
    except BaseException:  # a full disk, an interrupt: remove the partial file
        sink.abort()
        with suppress(OSError):
            path.unlink(missing_ok=True)
        raise


def write_bin(docs: ShardDocuments, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
              bin_path: Path, idx_path: Path) -> tuple[Digest, Digest]:
    """The shard's .bin (each document's tokens then EOS) and its .idx."""
    little = little_endian(dtype)
    item = little.itemsize
    lengths = docs.n_tokens + 1
    ends = np.cumsum(lengths * item)

    def fill(chunk: memoryview, start: int, end: int) -> None:
        base = int(ends[start - 1]) if start else 0
        eos_at = ends[start:end] - base - item
        read = reader.read_into
        for part, offset, at, size in zip(docs.part[start:end].tolist(), docs.tokens_offset[start:end].tolist(),
                                          (eos_at - docs.n_tokens[start:end] * item).tolist(),
                                          (docs.n_tokens[start:end] * item).tolist()):
            read(part, offset, chunk[at:at + size])
        np.frombuffer(chunk, dtype=little)[eos_at // item] = eos_id

    bin_digest = _write_chunks(bin_path, lengths * item, fill, zeroed=False)
    with HashingWriter(idx_path) as index:
        index.write(megatron.index_bytes(lengths, little))
    return bin_digest, index.close()


def write_tar(docs: ShardDocuments, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
              first_pos: int, tar_path: Path) -> Digest:
    """The shard's WebDataset tar: three members per document in position order, then the
    end-of-archive blocks."""
    little = little_endian(dtype)
    item = little.itemsize
    block = wds.BLOCK_SIZE
    count = len(docs.jsons)
    json_sizes = np.fromiter(map(len, docs.jsons), dtype=np.int64, count=count)
    npy_sizes = wds.npy_sizes(docs.n_tokens + 1, little)
    npy_head = len(wds.npy_header(0, little))
    # Offsets of each member's data within its sample; the end-of-archive blocks are one more
    # "sample" that stays zeros.
    json_at = np.full(count, block, dtype=np.int64)
    npy_at = json_at + wds.padded_size(json_sizes) + block
    text_at = npy_at + wds.padded_size(npy_sizes) + block
    spans = np.append(text_at + wds.padded_size(docs.text_bytes), len(wds.END_OF_ARCHIVE))
    sample_at = np.concatenate(([0], np.cumsum(spans)[:-1]))
    npy_header = wds.npy_header_function(little)

    def fill(chunk: memoryview, start: int, end: int) -> None:
        end = min(end, count)
        if start >= end:
            return  # only the end-of-archive blocks
        at = sample_at[start:end] - int(sample_at[start])
        positions = np.arange(first_pos + start, first_pos + end)
        headers = [wds.member_headers(positions, suffix, sizes[start:end]).data.cast("B")
                   for suffix, sizes in ((wds.JSON_SUFFIX, json_sizes), (wds.TOKENS_SUFFIX, npy_sizes),
                                         (wds.TEXT_SUFFIX, docs.text_bytes))]
        tokens_at = at + npy_at[start:end] + npy_head
        eos_at = tokens_at + docs.n_tokens[start:end] * item
        np.frombuffer(chunk, dtype=little)[eos_at // item] = eos_id
        read = reader.read_into
        for k, (json_bytes, sample, token_start, eos_start, text_start, part, tokens_offset, text_offset,
                text_size, tokens) in enumerate(zip(
                docs.jsons[start:end], at.tolist(), tokens_at.tolist(), eos_at.tolist(),
                (at + text_at[start:end]).tolist(), docs.part[start:end].tolist(),
                docs.tokens_offset[start:end].tolist(), docs.text_offset[start:end].tolist(),
                docs.text_bytes[start:end].tolist(), docs.n_tokens[start:end].tolist())):
            header = slice(k * block, (k + 1) * block)
            chunk[sample:sample + block] = headers[0][header]
            chunk[sample + block:sample + block + len(json_bytes)] = json_bytes
            npy_start = token_start - npy_head
            chunk[npy_start - block:npy_start] = headers[1][header]
            chunk[npy_start:token_start] = npy_header(tokens + 1)
            read(part, tokens_offset, chunk[token_start:eos_start])
            chunk[text_start - block:text_start] = headers[2][header]
            read(part, text_offset, chunk[text_start:text_start + text_size])

    return _write_chunks(tar_path, spans, fill, zeroed=True)


def write_unit(unit: str, spec: ShardSpec, docs: ShardDocuments, reader: PartReader, dtype: np.dtype[Any],
               eos_id: int, work_dir: Path) -> dict[str, tuple[Path, Digest]]:
    """Write one unit of a shard into `work_dir`; returns {format: (path, digest)}."""
    stem = work_dir / f"shard-{spec.index:05d}"
    if len(docs.n_tokens) != spec.documents:
        raise IntegrityError(f"shard {spec.index}: found {len(docs.n_tokens)} documents, the plan has {spec.documents}")
    paths = {fmt: stem.with_suffix(f".{artifact_format(fmt).extension}") for fmt in unit_formats(unit)}
    if unit == BIN:
        bin_path, idx_path = paths[BIN], paths[IDX]
        try:
            bin_digest, idx_digest = write_bin(docs, reader, dtype, eos_id, bin_path, idx_path)
        except OSError as exc:  # the .bin's own errors are StorageIOErrors already: this is the .idx
            for path in (bin_path, idx_path):
                with suppress(OSError):
                    path.unlink(missing_ok=True)
            raise StorageIOError.from_os_error("writing", idx_path, exc) from exc
        if bin_digest.size != spec.bin_size:
            raise IntegrityError(f"shard {spec.index}: wrote {bin_digest.size} .bin bytes, planned {spec.bin_size}")
        return {BIN: (bin_path, bin_digest), IDX: (idx_path, idx_digest)}
    tar_path = paths[WDS]
    digest = write_tar(docs, reader, dtype, eos_id, spec.first_pos, tar_path)
    if digest.size != spec.tar_size:
        raise IntegrityError(f"shard {spec.index}: wrote {digest.size} .tar bytes, planned {spec.tar_size}")
    return {WDS: (tar_path, digest)}
