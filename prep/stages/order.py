"""The global order, partitioned: every document gets a 128-bit order key (a keyed permutation of
its text hash), documents are routed into key-range buckets, and each bucket is deduplicated and
sorted on its own. Memory of every task depends on its own part or bucket, never on the corpus.

Route (one task per tokenize part): read the part's metadata, compute keys, write the part's
entries grouped by bucket and sorted by key. Order (one task per bucket): gather the bucket's
slice of every route output, sort by key then input order, keep the first of each run of equal
keys (equal keys are equal text hashes: the key is a bijection of the hash), and cut the bucket
into content-defined shard leaves (prep.stages.leaves).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prep.errors import IntegrityError
from prep.hashing import Digest, HashingWriter
from prep.manifest import canonical
from prep.stages.columns import to_numbers
from prep.stages.intermediate import hash_pairs, read_columns
from prep.stages.keys import bucket_of, order_keys
from prep.stages.specs import Part

ENTRY_DTYPE = np.dtype([
    ("key_hi", "<u8"), ("key_lo", "<u8"), ("part", "<u4"), ("row", "<u4"), ("text_offset", "<u8"),
    ("text_bytes", "<u8"), ("tokens_offset", "<u8"), ("n_tokens", "<u8"), ("id_offset", "<u8"),
    ("id_len", "<u4"), ("flags", "<u4"),
])
"""One document of a route or bucket object: 72 bytes, little-endian (docs/manifests.md)."""
NO_ID = 0xFFFFFFFF  # id_len of a document without a recorded id
MAGIC = b"PREPENT1"
_HEAD = struct.Struct("<8sQ")
_ROUTE_COLUMNS = ["row", "id", "text_hash", "text_bytes", "n_tokens", "text_offset", "tokens_offset"]


@dataclass(frozen=True)
class EntryFile:
    """A route or bucket object opened for reading: its header, and where entries and ids start."""

    path: Path
    header: dict[str, Any]
    entries_at: int
    ids_at: int

    @classmethod
    def open(cls, path: Path) -> EntryFile:
        """Read the header of an entries object; IntegrityError when it is not one."""
        with open(path, "rb") as handle:
            head = handle.read(_HEAD.size)
            if len(head) != _HEAD.size or _HEAD.unpack(head)[0] != MAGIC:
                raise IntegrityError(f"{path}: not a prep entries object")
            length = _HEAD.unpack(head)[1]
            header = canonical.loads(handle.read(length))
        if not isinstance(header, dict) or not isinstance(header.get("count"), int):
            raise IntegrityError(f"{path}: entries object header is malformed")
        entries_at = _HEAD.size + length
        return cls(path, header, entries_at, entries_at + header["count"] * ENTRY_DTYPE.itemsize)

    def read(self, first: int, count: int) -> tuple[np.ndarray, bytes]:
        """Entries [first, first + count) and the ids they point into (offsets are object-wide)."""
        if first < 0 or count < 0 or first + count > self.header["count"]:
            raise IntegrityError(f"{self.path}: entries {first}..{first + count} out of range")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            raw = os.pread(fd, count * ENTRY_DTYPE.itemsize, self.entries_at + first * ENTRY_DTYPE.itemsize)
            entries = np.frombuffer(raw, dtype=ENTRY_DTYPE).copy()
            if len(entries) != count:
                raise IntegrityError(f"{self.path}: shorter than its header says")
            with_id = entries["id_len"] != NO_ID
            if not with_id.any():
                return entries, b""
            start = int(entries["id_offset"][with_id].min())
            end = int((entries["id_offset"][with_id] + entries["id_len"][with_id]).max())
            ids = os.pread(fd, end - start, self.ids_at + start)
        finally:
            os.close(fd)
        entries["id_offset"][with_id] -= start
        return entries, ids


def write_entries(path: Path, header: dict[str, Any], entries: np.ndarray, ids: bytes) -> Digest:
    """Write an entries object (magic, header length, canonical JSON header, entries, ids)."""
    body = canonical.dumps({**header, "count": len(entries)})
    with HashingWriter(path, durable=False) as out:
        out.write(_HEAD.pack(MAGIC, len(body)))
        out.write(body)
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


def route_part(part: Part, ordinal: int, seed: int, bits: int, out_path: Path) -> tuple[Digest, dict[str, Any]]:
    """Write one part's documents as entries grouped by bucket, sorted by order key within each."""
    table = read_columns(part.path, _ROUTE_COLUMNS)
    count = table.num_rows
    if count != part.documents:
        raise IntegrityError(f"{part.path}: {count} documents, the tokenize record says {part.documents}")
    key_hi, key_lo = order_keys(hash_pairs(table.column("text_hash")), seed)
    entries = np.zeros(count, dtype=ENTRY_DTYPE)
    entries["key_hi"], entries["key_lo"], entries["part"] = key_hi, key_lo, ordinal
    entries["row"] = to_numbers(table.column("row"))
    for name in ("text_offset", "text_bytes", "tokens_offset", "n_tokens"):
        entries[name] = to_numbers(table.column(name))
    offsets, lens, blob = pack_id_column(table.column("id"))
    entries["id_offset"], entries["id_len"] = offsets, lens
    order = _key_order(entries)  # a bucket is its keys' top bits: key order groups the buckets too
    entries = entries[order]
    buckets = bucket_of(entries["key_hi"], bits)
    entries, blob = _regroup_ids(entries, blob)
    counts = np.bincount(buckets, minlength=1 << bits) if count else np.zeros(1 << bits, dtype=np.int64)
    digest = write_entries(out_path, {"schema": "prep.entries/1", "kind": "route", "bits": bits,
                                      "buckets": counts.tolist()}, entries, blob)
    return digest, {"documents": count}


def _regroup_ids(entries: np.ndarray, blob: bytes) -> tuple[np.ndarray, bytes]:
    """Rewrite the id blob in entry order, so a run of entries has a contiguous run of ids."""
    with_id = entries["id_len"] != NO_ID
    if not with_id.any():
        return entries, b""
    regrouped = gather_bytes(np.frombuffer(blob, dtype=np.uint8), entries["id_offset"][with_id],
                             entries["id_len"][with_id])
    lengths = np.where(with_id, entries["id_len"], 0).astype(np.int64)
    entries["id_offset"] = (np.cumsum(lengths) - lengths).astype(np.uint64)
    return entries, regrouped


def bucket_slice(route: EntryFile, bucket: int) -> tuple[int, int]:
    """(first entry, count) of `bucket` in a route object."""
    counts = route.header["buckets"]
    return int(sum(counts[:bucket])), int(counts[bucket])


def gather_bucket(routes: Sequence[Path], bucket: int) -> tuple[np.ndarray, bytes]:
    """Every route object's entries of `bucket`, concatenated, ids rebased onto one blob."""
    opened = [EntryFile.open(path) for path in routes]
    slices = [bucket_slice(route, bucket) for route in opened]
    merged = np.zeros(sum(count for _, count in slices), dtype=ENTRY_DTYPE)
    blobs: list[bytes] = []
    base = at = 0
    for route, (first, count) in zip(opened, slices):
        if not count:
            continue
        entries, ids = route.read(first, count)
        entries["id_offset"][entries["id_len"] != NO_ID] += np.uint64(base)
        merged[at:at + count] = entries
        base, at = base + len(ids), at + count
        blobs.append(ids)
    return merged, b"".join(blobs)


def _key_order(entries: np.ndarray) -> np.ndarray:
    """The permutation sorting entries by (key_hi, key_lo, part, row): one argsort of key_hi,
    then a lexsort of only the entries whose key_hi is shared (duplicates, mostly)."""
    order = np.argsort(entries["key_hi"], kind="stable")
    high = entries["key_hi"][order]
    tied = np.zeros(len(order), dtype=bool)
    same = high[1:] == high[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    if tied.any():
        at = np.flatnonzero(tied)
        sub = order[at]
        chosen = entries[sub]
        order[at] = sub[np.lexsort((chosen["row"], chosen["part"], chosen["key_lo"], chosen["key_hi"]))]
    return order


def sort_and_dedup(entries: np.ndarray, exact: bool) -> tuple[np.ndarray, int]:
    """Entries in order-key order (ties by input order); with `exact`, the first of each run of
    equal keys only. Returns the kept entries and how many were dropped."""
    order = _key_order(entries)
    if not exact or len(order) < 2:
        return entries[order], 0
    high, low = entries["key_hi"][order], entries["key_lo"][order]
    repeat = np.zeros(len(order), dtype=bool)
    repeat[1:] = (high[1:] == high[:-1]) & (low[1:] == low[:-1])
    return entries[order[~repeat]], int(repeat.sum())  # one copy of the entries, the kept ones


@dataclass(frozen=True)
class PartIdentity:
    """What a document's `.json` member takes from its part: the source and the line offset."""

    source: str
    line_offset: int

    def digest(self) -> bytes:
        """32 bytes naming the source inside leaf digests."""
        return hashlib.sha256(self.source.encode("utf-8", "surrogatepass")).digest()


_DIGEST_FIELDS = ["key_hi", "key_lo", "n_tokens", "text_bytes", "line", "id_len"]


def leaf_digest(entries: np.ndarray, ids: bytes, parts: Sequence[PartIdentity], part_digests: np.ndarray) -> str:
    """SHA-256 over what a shard's bytes are made of, and nothing about where they are stored:
    per document its order key (which stands for its text: the key is a bijection of the text
    hash), token count, text size, source, line and id. With the tokenizer and settings that the
    shard task key adds, equal digests mean equal shard bytes."""
    return leaf_digests(entries, ids, parts, part_digests, [(0, len(entries))])[0]


def leaf_digests(entries: np.ndarray, ids: bytes, parts: Sequence[PartIdentity], part_digests: np.ndarray,
                 bounds: Sequence[tuple[int, int]]) -> list[str]:
    """`leaf_digest(entries[first:end], ...)` for each (first, end) of `bounds`, building each
    document's record once however many ranges hold it."""
    offsets = np.asarray([part.line_offset for part in parts] or [0], dtype=np.int64)
    hashers = [hashlib.sha256() for _ in bounds]
    layout = np.dtype([("source", "V32")] + [(name, "<u8") for name in _DIGEST_FIELDS])
    for low in range(0, len(entries), GATHER_BLOCK):  # the records in blocks: one digest, bounded memory
        block = entries[low:low + GATHER_BLOCK]
        records = np.zeros(len(block), dtype=layout)
        records["source"] = part_digests[block["part"]]
        for name in _DIGEST_FIELDS:
            if name != "line":
                records[name] = block[name]
        records["line"] = offsets[block["part"]] + block["row"].astype(np.int64) + 1
        raw = memoryview(records.tobytes())
        for hasher, (first, end) in zip(hashers, bounds):
            start, stop = max(first, low) - low, min(end, low + len(block)) - low
            if start < stop:
                hasher.update(raw[start * layout.itemsize:stop * layout.itemsize])
    blob = np.frombuffer(ids, dtype=np.uint8)
    for hasher, (first, end) in zip(hashers, bounds):
        chunk = entries[first:end]
        with_id = chunk["id_len"] != NO_ID
        # One update of the ids one after another: the same digest as one update per id.
        hasher.update(gather_bytes(blob, chunk["id_offset"][with_id], chunk["id_len"][with_id]))
    return [hasher.hexdigest() for hasher in hashers]


def split_leaves(key_hi: np.ndarray, weights: np.ndarray, start: int, depth: int,
                 shard_size: int) -> list[tuple[int, int, int, int]]:
    """Cut sorted keys of one key range into leaves (start key, depth, first, end): a range is
    halved at its key midpoint while its weight exceeds `shard_size` and it holds more than one
    document, so a leaf depends only on the documents in it and its parent."""
    cumulative = np.zeros(len(weights) + 1, dtype=np.int64)
    np.cumsum(weights, out=cumulative[1:])
    leaves: list[tuple[int, int, int, int]] = []
    stack = [(start, depth, 0, len(key_hi))]
    while stack:
        lo, level, first, end = stack.pop()
        if end == first:
            continue
        if cumulative[end] - cumulative[first] <= shard_size or end - first <= 1 or level >= 64:
            leaves.append((lo, level, first, end))
            continue
        middle = lo + (1 << (63 - level))
        cut = first + int(np.searchsorted(key_hi[first:end], np.uint64(middle), side="left"))
        stack.append((middle, level + 1, cut, end))
        stack.append((lo, level + 1, first, cut))
    return leaves


def order_bucket(routes: Sequence[Path], parts: Sequence[PartIdentity], bucket: int, bits: int, exact: bool,
                 shard_size: int, itemsize: int, out_path: Path) -> tuple[Digest, dict[str, Any]]:
    """Dedup and sort one bucket, cut it into leaves, and write its kept entries."""
    gathered, blob = gather_bucket(routes, bucket)
    documents_read = len(gathered)
    entries, dropped = sort_and_dedup(gathered, exact)
    del gathered  # a bucket's entries are held once, plus the kept copy while sorting
    entries, ids = _regroup_ids(entries, blob)  # entries is sort_and_dedup's own copy
    part_digests = np.frombuffer(b"".join(part.digest() for part in parts) or b"\0" * 32, dtype="V32")
    weights = (entries["n_tokens"].astype(np.int64) + 1) * itemsize
    root = bucket << (64 - bits) if bits else 0
    cuts = split_leaves(entries["key_hi"], weights, root, bits, shard_size)
    ranges = list(dict.fromkeys([(first, end) for _, _, first, end in cuts] + [(0, len(entries))]))
    digests = dict(zip(ranges, leaf_digests(entries, ids, parts, part_digests, ranges)))  # a lone leaf is the bucket
    leaves = []
    for lo, level, first, end in cuts:
        chunk = entries[first:end]
        leaves.append({"start": f"{lo:016x}", "depth": level, "first": first, "count": end - first,
                       "tokens": int(chunk["n_tokens"].sum()) + (end - first), "bin_size": int(weights[first:end].sum()),
                       "text_bytes": int(chunk["text_bytes"].sum()), "digest": digests[first, end]})
    digest = write_entries(out_path, {"schema": "prep.entries/1", "kind": "bucket", "bits": bits, "bucket": bucket},
                           entries, ids)
    summary = {"documents_read": documents_read, "duplicates_dropped": dropped, "documents": len(entries),
               "bin_size": int(weights.sum()), "text_bytes": int(entries["text_bytes"].sum()),
               "digest": digests[0, len(entries)], "leaves": leaves}
    return digest, summary
