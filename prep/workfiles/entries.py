"""Entries objects: one fixed-size record per document (its order key, where its tokens, text
and id are), sorted by key, then the documents' ids. Four kinds (docs/manifests.md, "Entries
objects"): a tokenize task's *part* entries (every document of one part, with a prefix index so
that any key bucket is one read), a merge task's *run* entries (several parts' or runs' entries
merged, indexed the same way), an order task's *bucket* entries (its kept documents), and the
*route* entries that earlier builds wrote in a stage between the two (store layout 2).

A part's entries are written by the tokenize task that wrote its intermediate, from the metadata
it already holds: no stage reads the part again to route it, and nothing in them depends on the
part's place in the corpus (an order task fills in each entry's part ordinal as it reads them).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prep.errors import IntegrityError
from prep.hashing import Digest, HashingWriter
from prep.manifest import canonical
from prep.workfiles.columns import int_column, join_pieces, string_bytes, to_numbers
from prep.workfiles.intermediate import hash_pairs, io_errors, pread_into
from prep.workfiles.keys import bucket_of, order_keys

ENTRY_DTYPE = np.dtype([
    ("key_hi", "<u8"), ("key_lo", "<u8"), ("part", "<u4"), ("row", "<u4"), ("text_offset", "<u8"),
    ("text_bytes", "<u8"), ("tokens_offset", "<u8"), ("n_tokens", "<u8"), ("id_offset", "<u8"),
    ("id_len", "<u4"), ("meta_len", "<u4"),
])
"""One document of an entries object: 72 bytes, little-endian (docs/manifests.md). A document's
span of the ids blob, from `id_offset`, is its id (`id_len` bytes, none for NO_ID), then its
metadata (`meta_len` bytes; 0 in a build without metadata fields, whose objects are as they were
before metadata existed)."""
NO_ID = 0xFFFFFFFF  # id_len of a document without a recorded id
MAGIC = b"PREPENT1"
_HEAD = struct.Struct("<8sQ")
MAX_INDEX_BITS = 20
"""A part's index resolves key prefixes of at most this many bits (4 MiB of index at most)."""
INDEXED = {"part": 4, "run": 8}
"""The kinds of entries object with a prefix index, and the bytes of each of its counts (a run
may hold more than 2**32 entries)."""
PART_COLUMNS = ("row", "id", "text_hash", "text_bytes", "n_tokens", "text_offset", "tokens_offset")
"""The intermediate metadata columns a part's entries are made of (and `metadata` when it has it)."""


def span_lengths(entries: np.ndarray) -> np.ndarray:
    """Each entry's bytes in the ids blob: its id's (none for NO_ID) and its metadata's."""
    lengths: np.ndarray = np.where(entries["id_len"] != NO_ID, entries["id_len"], 0).astype(np.int64)
    lengths += entries["meta_len"]
    return lengths


def spanned(entries: np.ndarray) -> np.ndarray:
    """Which entries own a span of the ids blob (an id, perhaps empty, or metadata)."""
    return np.asarray((entries["id_len"] != NO_ID) | (entries["meta_len"] > 0))


def metadata_spans(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each entry's metadata is in the ids blob (after its id) and its length."""
    starts = entries["id_offset"].astype(np.int64) + np.where(entries["id_len"] != NO_ID, entries["id_len"], 0)
    return starts, entries["meta_len"].astype(np.int64)


@dataclass(frozen=True)
class EntryFile:
    """An entries object opened for reading: its header, and where its index, entries and ids start."""

    path: Path
    header: dict[str, Any]
    index_at: int
    entries_at: int
    ids_at: int
    index_width: int = 4  # bytes per cumulative count of the index: u32 for a part, u64 for a run

    @classmethod
    def open(cls, path: Path, fd: int | None = None) -> EntryFile:
        """Read the header of an entries object (through `fd`, an open descriptor of it, if
        given); IntegrityError when it is not one."""
        header, start = read_head(path, MAGIC, "entries object", fd)
        kind = header.get("kind")
        entries_bytes = header["count"] * ENTRY_DTYPE.itemsize
        if kind not in INDEXED:
            return cls(path, header, start, start, start + entries_bytes)
        bits = valid_index_bits(header, path, f"{kind} entries")
        width = INDEXED[kind]
        if kind == "part":  # the index, then the entries
            return cls(path, header, start, start + index_length(bits, width),
                       start + index_length(bits, width) + entries_bytes, width)
        # a run: the entries, then the index (a merge learns it while writing them), then the ids
        return cls(path, header, start + entries_bytes, start, start + entries_bytes + index_length(bits, width), width)

    def read(self, first: int, count: int, fd: int | None = None) -> tuple[np.ndarray, bytes]:
        """Entries [first, first + count) and the ids they point into (offsets are object-wide)."""
        if first < 0 or count < 0 or first + count > self.header["count"]:
            raise IntegrityError(f"{self.path}: entries {first}..{first + count} out of range")
        with descriptor(self.path, fd) as opened, io_errors("reading", self.path):
            entries = np.empty(count, dtype=ENTRY_DTYPE)  # read in place: no bytes object to copy from
            if pread_into(opened, entries.view(np.uint8).data, self.entries_at + first * ENTRY_DTYPE.itemsize) \
                    != entries.nbytes:  # cut short, perhaps mid-entry
                raise IntegrityError(f"{self.path}: shorter than its header says")
            with_id = spanned(entries)
            if not with_id.any():
                return entries, b""
            start = int(entries["id_offset"][with_id].min())
            end = int((entries["id_offset"][with_id] + span_lengths(entries)[with_id].astype(np.uint64)).max())
            ids = os.pread(opened, end - start, self.ids_at + start)
            if len(ids) != end - start:
                raise IntegrityError(f"{self.path}: its ids are shorter than its entries say")
        entries["id_offset"][with_id] -= start
        return entries, ids

    def prefix_range(self, low: int, high: int, fd: int | None = None) -> tuple[int, int]:
        """(first, end) of the entries whose key's top `index_bits` bits are in [low, high), from
        the index of a part's entries (two positional reads)."""
        return read_prefix_range(self.path, self.index_at, self.index_width, self.header["count"], (low, high), fd)

    def bucket_range(self, bucket: int, bits: int, fd: int | None = None) -> tuple[int, int]:
        """(first, count) of the entries a part's or run's entries object holds in key bucket
        `bucket` of `2**bits` (the keys' top `bits` bits); for `bits` finer than the index, of the
        coarser prefix holding the bucket (`read_bucket` keeps the bucket's own entries)."""
        if self.header.get("kind") not in INDEXED:
            raise IntegrityError(f"{self.path}: a {self.header.get('kind')} entries object, not a part's or a run's")
        first, end = self.prefix_range(*bucket_prefixes(bucket, bits, int(self.header["index_bits"])), fd)
        return first, end - first

    def read_bucket(self, bucket: int, bits: int, fd: int | None = None) -> tuple[np.ndarray, bytes]:
        """The entries of key bucket `bucket` of `2**bits` and the ids they point into (two
        index reads and one of the run, through `fd` if given)."""
        first, count = self.bucket_range(bucket, bits, fd)
        if not count:
            return np.zeros(0, dtype=ENTRY_DTYPE), b""
        entries, ids = self.read(first, count, fd)
        if bits > self.header["index_bits"]:  # the range is a coarser prefix: keep the bucket
            entries = entries[bucket_of(entries["key_hi"], bits) == bucket]
        return entries, ids


@contextmanager
def descriptor(path: Path, fd: int | None = None) -> Iterator[int]:
    """`fd` when the caller holds the file open, else a descriptor of `path` opened (and closed) here."""
    if fd is not None:
        yield fd
        return
    with io_errors("reading", path):
        opened = os.open(path, os.O_RDONLY)
    try:
        yield opened
    finally:
        os.close(opened)


def concat_numbered(pieces: Iterable[tuple[int, EntryFile, np.ndarray, bytes]]) -> tuple[np.ndarray, bytes]:
    """Entries read from several entries objects, as (first part's ordinal, object, entries, their
    ids), concatenated with their ids rebased onto one blob. Each entry is given its part's
    ordinal: a part's entries that of the part, a run's (which number parts from its own first)
    have the run's first part's added."""
    pieces_kept: list[np.ndarray] = []
    blobs: list[bytes] = []
    base = 0
    for first_part, source, entries, ids in pieces:
        if not len(entries):
            continue
        entries["id_offset"][spanned(entries)] += np.uint64(base)
        if source.header["kind"] == "run":
            entries["part"] += np.uint32(first_part)
        else:
            entries["part"] = first_part
        pieces_kept.append(entries)
        blobs.append(ids)
        base += len(ids)
    return (np.concatenate(pieces_kept) if pieces_kept else np.zeros(0, dtype=ENTRY_DTYPE)), b"".join(blobs)


def index_length(bits: int, width: int = 4) -> int:
    """Bytes of an index: 2**bits + 1 cumulative counts of `width` bytes."""
    return ((1 << bits) + 1) * width


def entries_head(header: dict[str, Any]) -> bytes:
    """The start of an entries object: magic, header length, the header as canonical JSON."""
    return object_head(MAGIC, header)


def object_head(magic: bytes, header: dict[str, Any]) -> bytes:
    """The start of a work file of this layout (entries, bands, drops objects): its 8-byte magic,
    the header's length (u64), the header as canonical JSON."""
    body = canonical.dumps(header)
    return _HEAD.pack(magic, len(body)) + body


def read_head(path: Path, magic: bytes, what: str, fd: int | None = None) -> tuple[dict[str, Any], int]:
    """The header of a work file that `object_head` began, and where its body starts;
    IntegrityError when the file is not a `what` or its header has no integer `count`."""
    with descriptor(path, fd) as opened, io_errors("reading", path):
        head = os.pread(opened, _HEAD.size, 0)
        if len(head) != _HEAD.size or _HEAD.unpack(head)[0] != magic:
            raise IntegrityError(f"{path}: not a prep {what}")
        length = _HEAD.unpack(head)[1]
        body = os.pread(opened, length, _HEAD.size)
    try:
        header = canonical.loads(body)
    except ValueError as exc:  # cut short or damaged
        raise IntegrityError(f"{path}: {what} header is malformed") from exc
    if not isinstance(header, dict) or not isinstance(header.get("count"), int) or header["count"] < 0:
        raise IntegrityError(f"{path}: {what} header is malformed")
    return header, _HEAD.size + length


def valid_index_bits(header: dict[str, Any], path: Path, what: str) -> int:
    """The header's `index_bits`; IntegrityError unless it is an integer in [0, MAX_INDEX_BITS]."""
    bits = header.get("index_bits")
    if not (isinstance(bits, int) and not isinstance(bits, bool) and 0 <= bits <= MAX_INDEX_BITS):
        raise IntegrityError(f"{path}: {what} without a valid index_bits")
    return bits


def prefix_index(values: np.ndarray, bits: int, width: int = 4) -> np.ndarray:
    """The index of sorted u64 `values` by their top `bits` bits: 2**bits + 1 cumulative counts
    (`width`-byte little-endian), count `i` the number of values whose prefix is less than `i`."""
    prefixes = bucket_of(values, bits) if len(values) else np.zeros(0, dtype=np.int64)
    index = np.zeros((1 << bits) + 1, dtype=f"<u{width}")
    np.cumsum(np.bincount(prefixes, minlength=1 << bits), out=index[1:])
    return index


def bucket_prefixes(bucket: int, bits: int, index_bits: int) -> tuple[int, int]:
    """The prefixes [low, high) of an `index_bits` index that hold bucket `bucket` of `2**bits`:
    the bucket's own when the index is as fine or finer, else the one coarser prefix holding it."""
    if bits <= index_bits:
        shift = index_bits - bits
        return bucket << shift, (bucket + 1) << shift
    prefix = bucket >> (bits - index_bits)
    return prefix, prefix + 1


def read_prefix_range(path: Path, index_at: int, width: int, count: int, prefixes: tuple[int, int],
                      fd: int | None = None) -> tuple[int, int]:
    """(first, end) of the records whose prefix is in [low, high) of `prefixes`, from the index
    of `width`-byte counts at `index_at` of a file of `count` records (two positional reads)."""
    with descriptor(path, fd) as opened, io_errors("reading", path):
        counts = [os.pread(opened, width, index_at + width * at) for at in prefixes]
    if any(len(found) != width for found in counts):
        raise IntegrityError(f"{path}: its index is cut short")
    first, end = (int.from_bytes(found, "little") for found in counts)
    if not 0 <= first <= end <= count:
        raise IntegrityError(f"{path}: its index is out of order")
    return first, end


def write_entries(path: Path, header: dict[str, Any], entries: np.ndarray, ids: bytes, index: bytes = b"") -> Digest:
    """Write an entries object (magic, header length, canonical JSON header, a part's index,
    entries, ids)."""
    with io_errors("writing", path), HashingWriter(path, durable=False) as out:
        out.write(entries_head({**header, "count": len(entries)}))
        out.write(index)
        out.write(np.ascontiguousarray(entries, dtype=ENTRY_DTYPE).view(np.uint8).data)
        out.write(ids)
    return out.close()


GATHER_BLOCK = 1 << 16  # (start, length) pairs per numpy gather: bounds the index arrays


def gather_bytes(blob: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bytes:
    """`blob[start:start + length]` of each pair, concatenated: one slice when the pieces are
    already laid out one after another, else numpy gathers of a uint8 view."""
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if not total:
        return b""
    before = np.cumsum(lengths) - lengths
    used = lengths > 0
    first = int(starts[used][0])
    if np.array_equal(starts[used] - before[used], np.full(int(used.sum()), first)):
        return blob[first:first + total].tobytes()
    width = int(lengths[0])
    if width and not (lengths != width).any() and not (starts % width).any() and int(starts.max()) + width <= len(blob):
        rows: bytes = blob[:len(blob) - len(blob) % width].reshape(-1, width)[starts // width].tobytes()
        return rows  # fixed-width pieces (ids, mostly) as rows
    pieces = []
    for low in range(0, len(starts), GATHER_BLOCK):
        block_starts, block_lengths = starts[low:low + GATHER_BLOCK], lengths[low:low + GATHER_BLOCK]
        size = int(block_lengths.sum())
        shift = np.repeat(block_starts - (np.cumsum(block_lengths) - block_lengths), block_lengths)
        pieces.append(blob[shift + np.arange(size, dtype=np.int64)].tobytes())
    return b"".join(pieces)


def _string_chunks(column: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def pack_id_column(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, bytes]:
    """Offsets, lengths (NO_ID for nulls) and the concatenated UTF-8 of a string column, read
    from its buffers (the bytes `_pack_ids` makes of the column's strings)."""
    blobs, all_lengths, all_valid = [], [], []
    for chunk in _string_chunks(column):
        if not len(chunk):
            continue
        validity, offsets_buffer, data = chunk.buffers()
        width = np.dtype("<i8" if pa.types.is_large_string(chunk.type) else "<i4")
        offsets = np.frombuffer(offsets_buffer, dtype=width, count=len(chunk) + 1,
                                offset=chunk.offset * width.itemsize).astype(np.int64)
        valid = np.ones(len(chunk), dtype=bool)
        if validity is not None and chunk.null_count:
            bits = pa.Array.from_buffers(pa.bool_(), chunk.offset + len(chunk), [None, validity])
            valid = to_numbers(bits.slice(chunk.offset))
        lengths = np.where(valid, offsets[1:] - offsets[:-1], 0)
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
        blobs.append(gather_bytes(raw, offsets[:-1], lengths))
        all_lengths.append(lengths)
        all_valid.append(valid)
    blob = b"".join(blobs)
    blob.decode("utf-8")  # what decoding each id would check (the column is prep's own, hashed)
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, dtype=np.int64)
    valid = np.concatenate(all_valid) if all_valid else np.zeros(0, dtype=bool)
    offsets = (np.cumsum(lengths) - lengths).astype(np.uint64)
    return offsets, np.where(valid, lengths, NO_ID).astype(np.uint32), blob


def _pack_ids(ids: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """Offsets, lengths (NO_ID for none) and the concatenated UTF-8 of `ids` (the reference of
    `pack_id_column`)."""
    encoded = [b"" if doc_id is None else doc_id.encode("utf-8", "surrogatepass") for doc_id in ids]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded), dtype=np.uint64)
    if len(encoded) > 1:
        offsets[1:] = np.cumsum(lengths[:-1])
    lens = np.where([doc_id is None for doc_id in ids], NO_ID, lengths).astype(np.uint32)
    return offsets, lens, b"".join(encoded)


def regroup_ids(entries: np.ndarray, blob: bytes) -> tuple[np.ndarray, bytes]:
    """Rewrite the id blob in entry order, so a run of entries has a contiguous run of ids, and
    every id offset as the sum of the ids before it (the same whatever blob the entries came
    from: a part's or a run's)."""
    with_id = spanned(entries)
    if not with_id.any():
        entries["id_offset"] = 0
        return entries, b""
    lengths = span_lengths(entries)
    regrouped = gather_bytes(np.frombuffer(blob, dtype=np.uint8), entries["id_offset"][with_id], lengths[with_id])
    entries["id_offset"] = (np.cumsum(lengths) - lengths).astype(np.uint64)
    return entries, regrouped


def take_entries(entries: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`entries[index]` for an integer index, gathered as rows of nine u64 (an entry is 72 bytes):
    numpy copies structured records one field at a time, six times slower."""
    rows = np.ascontiguousarray(entries).view("<u8").reshape(-1, ENTRY_DTYPE.itemsize // 8)
    taken: np.ndarray = np.take(rows, index, axis=0).view(ENTRY_DTYPE).reshape(-1)
    return taken


def key_order(entries: np.ndarray) -> np.ndarray:
    """The permutation sorting entries by (key_hi, key_lo, part, row)."""
    return key_order_of(entries["key_hi"], entries["key_lo"], entries["part"], entries["row"])


def key_order_of(key_hi: np.ndarray, key_lo: np.ndarray, *ties: np.ndarray, runs: np.ndarray | None = None) -> np.ndarray:
    """The permutation sorting by (key_hi, key_lo, *ties), `ties` unique together: one argsort of
    key_hi, then a lexsort of only the positions whose key_hi is shared (duplicates, mostly).
    `runs`, a permutation putting key_hi in a few sorted runs, makes the argsort a merge of them."""
    if runs is not None and len(runs) != len(key_hi):
        raise ValueError(f"{len(runs)} positions in the key runs, for {len(key_hi)} keys")
    order = np.argsort(key_hi, kind="stable") if runs is None else runs[np.argsort(key_hi[runs], kind="stable")]
    high = key_hi[order]
    tied = np.zeros(len(order), dtype=bool)
    same = high[1:] == high[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    if tied.any():
        at = np.flatnonzero(tied)
        sub = order[at]
        order[at] = sub[np.lexsort((*(tie[sub] for tie in reversed(ties)), key_lo[sub], key_hi[sub]))]
    return order


def index_bits_for(count: int) -> int:
    """The resolution of a part's index: about one prefix per document (so a bucket finer than
    the index costs a read of about one document's entries), at most MAX_INDEX_BITS."""
    return min(MAX_INDEX_BITS, max(0, count - 1).bit_length())


def part_entries(table: pa.Table, seed: int, runs: np.ndarray | None = None) -> tuple[np.ndarray, bytes]:
    """A part's documents as entries (part ordinal 0) sorted by order key, then row, and their
    ids in that order. `table` has the PART_COLUMNS of the part's metadata, in row order; `runs`
    (IntermediateWriter.key_runs) speeds up the sort. Each column is put in order on its own and
    written once into the entries (one entries array)."""
    key_hi, key_lo = order_keys(hash_pairs(table.column("text_hash")), seed)
    rows = to_numbers(table.column("row"))
    order = key_order_of(key_hi, key_lo, rows, runs=runs)
    entries = np.zeros(table.num_rows, dtype=ENTRY_DTYPE)
    entries["key_hi"], entries["key_lo"], entries["row"] = key_hi[order], key_lo[order], rows[order]
    for name in ("text_offset", "text_bytes", "tokens_offset", "n_tokens"):
        entries[name] = to_numbers(table.column(name))[order]
    # Arrow's take puts the ids in entry order, string by string: no regrouping of a packed blob.
    taken = int_column(order, pa.int64())
    entries["id_offset"], entries["id_len"], blob = pack_id_column(table.column("id").take(taken))
    if "metadata" in table.schema.names:
        blob = _with_metadata(entries, blob, table.column("metadata").take(taken))
    return entries, blob


def _with_metadata(entries: np.ndarray, ids: bytes, metadata: pa.ChunkedArray | pa.Array) -> bytes:
    """The ids blob of `entries` (whose ids are packed in `ids`) with each entry's metadata after
    its id; sets their `meta_len` and `id_offset`."""
    column = metadata.combine_chunks() if isinstance(metadata, pa.ChunkedArray) else metadata
    values, offsets = string_bytes(column)
    id_lengths = np.where(entries["id_len"] != NO_ID, entries["id_len"], 0).astype(np.int64)
    starts = np.stack([entries["id_offset"].astype(np.int64), len(ids) + offsets[:-1]], axis=1)
    blob, spans = join_pieces(np.frombuffer(ids + values, dtype=np.uint8), starts,
                              np.stack([id_lengths, np.diff(offsets)], axis=1))
    entries["meta_len"] = np.diff(offsets)
    entries["id_offset"] = spans[:-1]
    return blob


def write_part_entries(path: Path, table: pa.Table, seed: int, runs: np.ndarray | None = None) -> Digest:
    """Write a part's entries object: its entries in key order and the index of their key prefixes."""
    entries, ids = part_entries(table, seed, runs)
    bits = index_bits_for(len(entries))
    index = prefix_index(entries["key_hi"], bits)
    return write_entries(path, {"schema": "prep.entries/1", "kind": "part", "index_bits": bits}, entries, ids,
                         index.tobytes())
