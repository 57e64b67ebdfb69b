"""Shard assembly: write each planned shard file front to back, gathering its documents from the
intermediates in key order (the shard's slices of the bucket objects say where they are).

A shard has one unit of work per output format: `bin` (the .bin and .idx), `wds` (the .tar), or
any format prep/formats/registry.py holds, which names the unit's files and its writer here.
A unit writes its file sequentially, a chunk of a few MiB at a time. The token ids (and text) of
up to PAYLOAD_BYTES of a window's documents are gathered from the intermediates at once, with few
reads (prep.stages.gather); each chunk is laid out in memory from them (tar headers for the whole
chunk at once; a tar's long token runs and texts are read straight to their place in the
chunk, one copy instead of two), then prep.stages.sink writes it past the page cache, reads it
back from the disk and hashes what it read, on threads, while the next one is laid out; memory holds the sink's
buffers, one gathered block and a few dozen bytes per document of a window.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from prep.errors import InputError, IntegrityError, StorageIOError
from prep.formats import little_endian, megatron, sidecar, wds
from prep.formats.megatron_spec import BIN, BIN_METADATA, IDX
from prep.formats.registry import load, output_format
from prep.formats.wds_spec import WDS
from prep.hashing import HashingWriter, digest_file
from prep.quality.sourcemix import SourceTally
from prep.stages import gather
from prep.stages.gather import PartReader as PartReader  # the runner opens one per task
from prep.stages.gather import scatter_blocks
from prep.stages.members import PartNames, document_ids, document_metadata, sample_jsons
from prep.stages.sink import CHUNK_BYTES, ChunkSink, Written
from prep.workfiles.entries import EntryFile
from prep.workfiles.shardplan import ShardPlan

PAYLOAD_BYTES = 32 << 20
"""Token and text bytes of a window gathered at once (prep.stages.gather), so neighbouring documents
of an intermediate are read together; bounds a unit's memory for long documents."""


@dataclass(frozen=True)
class ShardDocuments:
    """A window of one shard's documents in key order: where each one's bytes are, its key and its `.json`."""

    part: np.ndarray  # index into the parts list
    text_offset: np.ndarray
    text_bytes: np.ndarray
    tokens_offset: np.ndarray
    n_tokens: np.ndarray  # without EOS
    key_hi: np.ndarray
    key_lo: np.ndarray
    jsons: bytes  # every `.json` member, one after another; empty unless the unit's format needs them
    json_offsets: np.ndarray  # n + 1 offsets into `jsons` (just [0] without them)
    ids: bytes = b""  # every document id (UTF-8), one after another; empty unless the unit's format needs them
    id_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    metadata: bytes = b""  # every document's metadata (compact JSON), one after another; empty without metadata
    metadata_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))


JSON_BLOCK = 1 << 16  # documents per vectorized `.json` batch: bounds its index arrays
WINDOW_DOCUMENTS = 1 << 18
"""Documents of a shard held at once (about 250 bytes each with `.json` members): a unit's
memory does not grow with its shard's document count."""
_Carry = tuple[int, int, int]  # the last document's order key (hi, lo) and its copy number


@dataclass(frozen=True)
class ShardSource:
    """One shard's documents, read from its slices of the bucket objects window by window."""

    plan: ShardPlan
    buckets: dict[int, Path]
    names: PartNames
    with_json: bool
    with_ids: bool = False
    metadata_keys: tuple[str, ...] = ()  # the build's metadata keys (Pipeline.metadata_keys); () without metadata
    tally: SourceTally | None = None  # counts each window's documents per input file as it is read

    def windows(self) -> Iterator[ShardDocuments]:
        """The shard's documents in key order, at most WINDOW_DOCUMENTS at a time (with their ids
        when `with_ids`, their metadata in a build with metadata keys)."""
        carry: _Carry | None = None
        for bucket, first, count in self.plan.slices:
            entry_file = EntryFile.open(self.buckets[bucket])
            for low in range(first, first + count, WINDOW_DOCUMENTS):
                entries, ids = entry_file.read(low, min(WINDOW_DOCUMENTS, first + count - low))
                if self.tally is not None:
                    self.tally.count((bucket, low), entries["part"])
                key_lo, carry = _sample_key_lo(entries, carry)
                docs = _window(entries, ids, key_lo, self.names, self.with_json, bool(self.metadata_keys))
                if self.with_ids:
                    doc_ids, id_offsets = document_ids(entries, ids, self.names)
                    docs = replace(docs, ids=doc_ids, id_offsets=id_offsets)
                if self.metadata_keys:
                    metadata, metadata_offsets = document_metadata(entries, ids)
                    docs = replace(docs, metadata=metadata, metadata_offsets=metadata_offsets)
                yield docs


def collect_shard(plan: ShardPlan, buckets: dict[int, Path], names: PartNames, with_json: bool,
                  with_ids: bool = False, metadata_keys: tuple[str, ...] = (),
                  tally: SourceTally | None = None) -> ShardSource:
    """The documents of one shard, read lazily from its slices of the bucket objects (in key order),
    counted per input file into `tally` if given."""
    found = sum(count for _, _, count in plan.slices)
    if found != plan.documents:
        raise IntegrityError(f"shard {plan.name}: found {found} documents, the plan has {plan.documents}")
    return ShardSource(plan, buckets, names, with_json, with_ids, metadata_keys, tally)


def _window(entries: np.ndarray, ids: bytes, key_lo: np.ndarray, names: PartNames, with_json: bool,
            with_metadata: bool) -> ShardDocuments:
    jsons: list[bytes] = []
    sizes: list[np.ndarray] = []
    for low in range(0, len(entries), JSON_BLOCK) if with_json else ():
        blob, offsets = sample_jsons(entries[low:low + JSON_BLOCK], ids, names, with_metadata)
        jsons.append(blob)
        sizes.append(np.diff(offsets))
    json_offsets = np.zeros(len(entries) + 1 if with_json else 1, dtype=np.int64)
    if sizes:
        np.cumsum(np.concatenate(sizes), out=json_offsets[1:])
    return ShardDocuments(
        part=entries["part"].astype(np.int64), text_offset=entries["text_offset"].astype(np.int64),
        text_bytes=entries["text_bytes"].astype(np.int64), tokens_offset=entries["tokens_offset"].astype(np.int64),
        n_tokens=entries["n_tokens"].astype(np.int64), key_hi=entries["key_hi"], key_lo=key_lo,
        jsons=b"".join(jsons), json_offsets=json_offsets)


def _sample_key_lo(entries: np.ndarray, carry: _Carry | None) -> tuple[np.ndarray, _Carry | None]:
    """The low halves of the sample keys: the order keys, except that with dedup off the k-th
    further copy of a text (same order key) gets low half + k, so tar sample keys stay unique.
    `carry` continues a run of copies from the previous window; returns the next window's."""
    if not len(entries):
        return entries["key_lo"].copy(), carry
    hi, lo = entries["key_hi"], entries["key_lo"]
    key_lo = lo.copy()
    same = np.zeros(len(entries), dtype=bool)
    same[1:] = (hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1])
    continued = carry is not None and (int(hi[0]), int(lo[0])) == carry[:2]
    copies = np.zeros(len(entries), dtype=np.int64)
    if same.any() or continued:
        run_start = np.maximum.accumulate(np.where(same, 0, np.arange(len(entries))))
        copies = np.arange(len(entries)) - run_start
        if continued and carry is not None:
            copies[run_start == 0] += carry[2] + 1
        with np.errstate(over="ignore"):
            key_lo += copies.astype(np.uint64)
    return key_lo, (int(hi[-1]), int(lo[-1]), int(copies[-1]))


def chunks(spans: np.ndarray, limit: int | None = None) -> list[tuple[int, int]]:
    """[start, end) document ranges of about `limit` (default CHUNK_BYTES) bytes each (at least one document)."""
    limit = CHUNK_BYTES if limit is None else limit
    ends = np.cumsum(spans)
    bounds, start = [], 0
    while start < len(spans):
        base = ends[start - 1] if start else 0
        end = max(start + 1, int(np.searchsorted(ends, base + limit, "right")))
        bounds.append((start, end))
        start = end
    return bounds


_Fill = Callable[[memoryview, int, int], None]
_Pieces = Iterator[tuple[np.ndarray, _Fill]]


def _write_chunks(path: Path, pieces: _Pieces, zeroed: bool, read_back: bool) -> Written:
    """Write a file of consecutive spans, piece by piece and chunk by chunk: for each piece
    (spans, fill), `fill(chunk, start, end)` lays out its spans [start, end) in a buffer that
    is zero-filled when `zeroed` (else fully overwritten); read back as written unless not `read_back`."""
    sink = ChunkSink(path, read_back)
    try:
        for spans, fill in pieces:
            for start, end in chunks(spans):
                chunk = sink.buffer(int(spans[start:end].sum()), zeroed)
                try:
                    fill(chunk, start, end)
                except OSError as exc:  # reading an intermediate
                    raise StorageIOError.from_os_error("reading", exc.filename or f"the intermediates of {path}",
                                                       exc) from exc
                sink.write(chunk)
        return Written(path, sink.close(), sink.read_back)
    except BaseException:  # a full disk, an interrupt: remove the partial file
        sink.abort()
        with suppress(OSError):
            path.unlink(missing_ok=True)
        raise


def _bin_pieces(docs: ShardDocuments, reader: PartReader, little: np.dtype[Any], eos_id: int) -> _Pieces:
    """A window's .bin spans (each document's tokens then EOS), PAYLOAD_BYTES at a time: each
    block's tokens are gathered into its .bin layout at once, then copied out chunk by chunk."""
    item = little.itemsize
    spans = (docs.n_tokens + 1) * item
    for start, end in chunks(spans, PAYLOAD_BYTES):
        block = spans[start:end]
        ends = np.cumsum(block)
        payload = np.empty(int(ends[-1]), dtype=np.uint8)
        reader.gather(payload, docs.part[start:end], docs.tokens_offset[start:end], block - item, ends - block)
        payload.view(little)[ends // item - 1] = eos_id
        yield block, _copier(payload, ends)


def _copier(payload: np.ndarray, ends: np.ndarray) -> _Fill:
    def fill(chunk: memoryview, start: int, end: int) -> None:
        np.frombuffer(chunk, dtype=np.uint8)[:] = payload[int(ends[start - 1]) if start else 0:int(ends[end - 1])]

    return fill


def write_bin(source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
              bin_path: Path, idx_path: Path, read_back: bool = True) -> tuple[Written, Written]:
    """The shard's .bin (each document's tokens then EOS) and its .idx (from 4 bytes per document)."""
    little = little_endian(dtype)
    lengths: list[np.ndarray] = []

    def pieces() -> _Pieces:
        for docs in source.windows():
            lengths.append((docs.n_tokens + 1).astype("<i4"))
            yield from _bin_pieces(docs, reader, little, eos_id)

    bin_file = _write_chunks(bin_path, pieces(), zeroed=False, read_back=read_back)
    with HashingWriter(idx_path) as index:
        for piece in megatron.index_pieces_of_runs(lengths, little):
            index.write(piece)
    return bin_file, Written(idx_path, index.close(), read_back=False)


def _tar_pieces(docs: ShardDocuments, reader: PartReader, little: np.dtype[Any], eos_id: int) -> _Pieces:
    """A window's tar spans (three members per document), PAYLOAD_BYTES of tokens and text at a
    time: each block's short spans are gathered at once, then placed into the members chunk by
    chunk; long spans are read straight into their chunk."""
    item = little.itemsize
    block = wds.BLOCK_SIZE
    count = len(docs.json_offsets) - 1
    json_sizes = np.diff(docs.json_offsets)
    npy_sizes = wds.npy_sizes(docs.n_tokens + 1, little)
    npy_head = len(wds.npy_header(0, little))
    # Offsets of each member's data within its sample.
    json_at = np.full(count, block, dtype=np.int64)
    npy_at = json_at + wds.padded_size(json_sizes) + block
    text_at = npy_at + wds.padded_size(npy_sizes) + block
    spans = text_at + wds.padded_size(docs.text_bytes)
    sample_at = np.concatenate(([0], np.cumsum(spans)[:-1]))
    jsons = np.frombuffer(docs.jsons, dtype=np.uint8)
    token_bytes = docs.n_tokens * item
    payload = _TarPayload(np.repeat(docs.part, 2), _pairs(docs.tokens_offset, docs.text_offset),
                      _pairs(token_bytes, docs.text_bytes))

    def fill(chunk: memoryview, start: int, end: int) -> None:
        at = sample_at[start:end] - int(sample_at[start])
        raw = np.frombuffer(chunk, dtype=np.uint8)
        _place_headers(raw, docs, start, end, (at, at + npy_at[start:end] - block, at + text_at[start:end] - block),
                       (json_sizes, npy_sizes, docs.text_bytes))
        blocks = raw.reshape(-1, block)
        first, last = int(docs.json_offsets[start]), int(docs.json_offsets[end])
        scatter_blocks(blocks, (at + block) // block, 0, jsons[first:last], docs.json_offsets[start:end] - first,
                       json_sizes[start:end])
        npy_start = at + npy_at[start:end]
        payload.place(reader, blocks, 2 * start, _pairs(npy_start + npy_head, at + text_at[start:end]))
        blocks[npy_start // block, :npy_head] = wds.npy_headers(docs.n_tokens[start:end] + 1, little)
        np.frombuffer(chunk, dtype=little)[(npy_start + npy_head + token_bytes[start:end]) // item] = eos_id

    for start, end in chunks(token_bytes + docs.text_bytes, PAYLOAD_BYTES):
        payload.gather(reader, 2 * start, 2 * end)
        yield spans[start:end], functools.partial(_shifted, fill, start)


def _pairs(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """first[0], second[0], first[1], second[1], ...: each document's token span, then its text span."""
    return np.stack((first, second), axis=1).reshape(-1)


class _TarPayload:
    """A window's token and text spans in the intermediates, in tar order: the short ones of the
    current block gathered into one payload, the long ones left to be read into their chunk."""

    def __init__(self, parts: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> None:
        self.parts, self.offsets, self.sizes = parts, offsets, sizes
        self.short = sizes < gather.DIRECT_BYTES
        self.payload, self.payload_at, self.first = np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64), 0

    def gather(self, reader: PartReader, first: int, end: int) -> None:
        """Read the short spans of pieces [first, end) into the payload, together."""
        sizes = np.where(self.short[first:end], self.sizes[first:end], 0)
        self.payload_at, self.first = np.cumsum(sizes) - sizes, first
        self.payload = np.empty(int(sizes.sum()), dtype=np.uint8)
        reader.gather(self.payload, self.parts[first:end], self.offsets[first:end], sizes, self.payload_at)

    def place(self, reader: PartReader, blocks: np.ndarray, first: int, targets: np.ndarray) -> None:
        """Put pieces first, first + 1, ... at `targets` in a chunk (its tar blocks, (n, 512) bytes): short ones from the payload,
        whole tar blocks at a time, long ones read from the intermediates straight to their place
        (one copy, no per-block indexing)."""
        end = first + len(targets)
        short, sizes = self.short[first:end], self.sizes[first:end]
        sources = self.payload_at[first - self.first:end - self.first]
        low = int(sources[0])  # scatter_blocks copies its data: only this chunk's part of the payload
        data = self.payload[low:int(sources[-1]) + int(sizes[-1] * short[-1])]
        columns = targets % wds.BLOCK_SIZE
        for column in np.unique(columns[short]).tolist():  # the tokens' column, and 0 for texts
            chosen = short & (columns == column)
            scatter_blocks(blocks, targets[chosen] // wds.BLOCK_SIZE, column, data, sources[chosen] - low,
                           sizes[chosen])
        long = ~short
        if long.any():
            reader.gather(blocks.reshape(-1), self.parts[first:end][long], self.offsets[first:end][long], sizes[long],
                          targets[long])


def _shifted(fill: _Fill, shift: int, chunk: memoryview, start: int, end: int) -> None:
    fill(chunk, start + shift, end + shift)


def write_tar(source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int, tar_path: Path,
              read_back: bool = True) -> Written:
    """The shard's WebDataset tar: three members per document in position order, then the
    end-of-archive blocks (a last piece left zero)."""
    little = little_endian(dtype)

    def pieces() -> _Pieces:
        for docs in source.windows():
            yield from _tar_pieces(docs, reader, little, eos_id)
        yield np.asarray([len(wds.END_OF_ARCHIVE)], dtype=np.int64), lambda chunk, start, end: None

    return _write_chunks(tar_path, pieces(), zeroed=True, read_back=read_back)


def _place_headers(raw: np.ndarray, docs: ShardDocuments, start: int, end: int, header_at: tuple[np.ndarray, ...],
                   sizes: tuple[np.ndarray, ...]) -> None:
    """Write the three member headers of documents [start, end) at their (block-aligned) offsets."""
    blocks = raw.reshape(-1, wds.BLOCK_SIZE)
    names = wds.hex_key_chars(docs.key_hi[start:end], docs.key_lo[start:end])
    key_sums = names.sum(axis=1, dtype=np.int64)
    for suffix, at, member_sizes in zip(wds.MEMBER_SUFFIXES, header_at, sizes):
        wds.place_headers(blocks, at // wds.BLOCK_SIZE, names, suffix, member_sizes[start:end], key_sums)


class UnitWriter(Protocol):
    """What an output format's `writer` is: write one shard's files (`paths`: each artifact format's
    path) from its documents, each file read back from the disk as written unless not `read_back`."""

    def __call__(self, source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
                 paths: Mapping[str, Path], read_back: bool) -> dict[str, Written]: ...


def write_metadata_file(source: ShardSource, path: Path) -> Written:
    """The shard's metadata file (prep.formats.sidecar): each document's id and metadata, in order."""
    try:
        writer = sidecar.SidecarWriter(path, source.metadata_keys)
        try:
            for docs in replace(source, with_json=False, with_ids=True).windows():
                writer.write(_pieces(docs.ids, docs.id_offsets, str), _pieces(docs.metadata, docs.metadata_offsets, bytes))
            writer.close()
        except BaseException:
            with suppress(Exception):
                writer.abort()
            raise
        return Written(path, digest_file(path), read_back=False)
    except BaseException as exc:
        with suppress(OSError):
            path.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise StorageIOError.from_os_error("writing", path, exc) from exc
        if isinstance(exc, ValueError):  # an id that is not UTF-8; metadata with an undeclared key
            raise InputError(f"the shard metadata file {path.name}: {exc}") from None
        raise


def _pieces(blob: bytes, offsets: np.ndarray, kind: type[Any]) -> list[Any]:
    """`blob` cut at `offsets`, each piece as bytes or (`kind` str) decoded from strict UTF-8."""
    view, bounds = memoryview(blob), offsets.tolist()
    pieces = [bytes(view[start:end]) for start, end in zip(bounds[:-1], bounds[1:])]
    return [piece.decode("utf-8") for piece in pieces] if kind is str else pieces


def write_bin_unit(source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
                   paths: Mapping[str, Path], read_back: bool) -> dict[str, Written]:
    """The `bin` unit: the .bin and .idx (a failed .idx removes both), and in a build with metadata
    fields the shard's metadata file."""
    bin_path, idx_path = paths[BIN], paths[IDX]
    metadata = {BIN_METADATA: write_metadata_file(source, paths[BIN_METADATA])} if source.metadata_keys else {}
    try:
        bin_file, idx_file = write_bin(source, reader, dtype, eos_id, bin_path, idx_path, read_back)
    except OSError as exc:  # the .bin's own errors are StorageIOErrors already: this is the .idx
        for path in (bin_path, idx_path):
            with suppress(OSError):
                path.unlink(missing_ok=True)
        raise StorageIOError.from_os_error("writing", idx_path, exc) from exc
    plan = source.plan
    if bin_file.digest.size != plan.bin_size:
        raise IntegrityError(f"shard {plan.name}: wrote {bin_file.digest.size} .bin bytes, planned {plan.bin_size}")
    return {BIN: bin_file, IDX: idx_file, **metadata}


def write_tar_unit(source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
                   paths: Mapping[str, Path], read_back: bool) -> dict[str, Written]:
    """The `wds` unit: the .tar."""
    return {WDS: write_tar(source, reader, dtype, eos_id, paths[WDS], read_back)}


def write_unit(unit: str, plan: ShardPlan, docs: ShardSource, reader: PartReader, dtype: np.dtype[Any],
               eos_id: int, work_dir: Path, read_back: bool = True) -> dict[str, Written]:
    """Write one unit of a shard into `work_dir` (its large file read back from the disk as written,
    unless not `read_back`); returns each file by its format."""
    fmt = output_format(unit)
    stem = work_dir / f"shard-{plan.name}"
    paths = {kind.name: Path(f"{stem}.{kind.extension}") for kind in fmt.written(bool(docs.metadata_keys))}
    return cast(UnitWriter, load(fmt.writer))(docs, reader, dtype, eos_id, paths, read_back)
