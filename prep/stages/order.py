"""The global order, partitioned: every document has a 128-bit order key (a keyed permutation of
its text hash), each tokenize task wrote its part's entries sorted by key (prep.workfiles.entries),
and each key bucket is deduplicated and sorted on its own. Memory of every task depends on its
own bucket, never on the corpus.

Order (one task per bucket): gather the bucket's entries from every part, or from the runs that
merge tasks made of them when the parts are many (one read each, prep.stages.merge), sort
by key then input order, keep the first of each run of equal keys (equal keys are equal text
hashes: the key is a bijection of the hash), and cut the bucket into content-defined shard
leaves.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.hashing import Digest
from prep.quality.lengths import measure
from prep.stages.neardedup import drop_near_duplicates, global_numbers
from prep.stages.specs import PartTable
from prep.workfiles.drops import open_drops
from prep.workfiles.entries import (
    NO_ID,
    EntryFile,
    concat_numbered,
    descriptor,
    gather_bytes,
    key_order,
    metadata_spans,
    regroup_ids,
    take_entries,
    write_entries,
)


def gather_bucket(sources: Sequence[tuple[Path, int]], bucket: int, bits: int) -> tuple[np.ndarray, bytes]:
    """Every source's entries of `bucket`, concatenated, each numbered with its part's ordinal.
    A source is a part's or a run's entries object with the ordinal of its first part. Each is
    opened once: its header, the two index reads and the run of the bucket go through one
    descriptor."""
    def read(path: Path) -> tuple[EntryFile, np.ndarray, bytes]:
        with descriptor(path) as fd:
            source = EntryFile.open(path, fd)
            return (source, *source.read_bucket(bucket, bits, fd))

    return concat_numbered((first_part, *read(path)) for path, first_part in sources)


def sort_and_dedup(entries: np.ndarray, exact: bool) -> tuple[np.ndarray, int]:
    """Entries in order-key order (ties by input order); with `exact`, the first of each run of
    equal keys only. Returns the kept entries and how many were dropped."""
    order = key_order(entries)
    if not exact or len(order) < 2:
        return take_entries(entries, order), 0
    high, low = entries["key_hi"][order], entries["key_lo"][order]
    repeat = np.zeros(len(order), dtype=bool)
    repeat[1:] = (high[1:] == high[:-1]) & (low[1:] == low[:-1])
    return take_entries(entries, order[~repeat]), int(repeat.sum())  # one copy of the entries, the kept ones


_DIGEST_COLUMNS = ("key_hi", "key_lo", "n_tokens", "text_bytes", "id_len")
_DIGEST_HEAD = struct.Struct("<QQ")


def leaf_digests(entries: np.ndarray, ids: bytes, parts: PartTable, bounds: Sequence[tuple[int, int]]) -> list[str]:
    """For each (first, end) of `bounds`, the SHA-256 over what a shard of entries[first:end]
    is made of, and nothing about where it is stored: per document its order key (which stands
    for its text: the key is a bijection of the text hash), token count, text size, source,
    line and id. With the tokenizer and settings that the shard task key adds, equal digests
    mean equal shard bytes."""
    offsets = np.frombuffer(parts.line_offsets or bytes(8), dtype="<i8")
    part_digests = np.frombuffer(parts.source_digests or bytes(32), dtype="V32")
    blob = np.frombuffer(ids, dtype=np.uint8)
    return [_range_digest(entries[first:end], blob, offsets, part_digests) for first, end in bounds]


def _range_digest(chunk: np.ndarray, blob: np.ndarray, line_offsets: np.ndarray, part_digests: np.ndarray) -> str:
    """One range's digest, column by column (fixed widths, so the framing is unambiguous): the
    count and the sorted SHA-256s of the sources its documents come from, then per document its
    source as an index into those (not its part's ordinal, which an input added elsewhere
    shifts), then each of _DIGEST_COLUMNS, its line number, and last the ids one after another."""
    hasher = hashlib.sha256()
    present = np.unique(chunk["part"])
    sources, rank = np.unique(part_digests[present], return_inverse=True)
    source_of_part = np.zeros(len(part_digests), dtype="<u4")
    source_of_part[present] = rank.reshape(-1)
    hasher.update(_DIGEST_HEAD.pack(len(chunk), len(sources)))
    hasher.update(sources.tobytes())
    hasher.update(source_of_part[chunk["part"]].tobytes())
    for name in _DIGEST_COLUMNS:
        hasher.update(np.ascontiguousarray(chunk[name]).tobytes())
    hasher.update((line_offsets[chunk["part"]] + chunk["row"].astype(np.int64) + 1).astype("<i8").tobytes())
    with_id = chunk["id_len"] != NO_ID
    hasher.update(gather_bytes(blob, chunk["id_offset"][with_id], chunk["id_len"][with_id]))
    if chunk["meta_len"].any():  # a build with metadata fields: the documents' metadata too
        starts, lengths = metadata_spans(chunk)
        hasher.update(np.ascontiguousarray(chunk["meta_len"]).tobytes())
        hasher.update(gather_bytes(blob, starts, lengths))
    return hasher.hexdigest()


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


def order_bucket(sources: Sequence[tuple[Path, int]], parts: PartTable, bucket: int, bits: int,
                 exact: bool, shard_size: int, itemsize: int, out_path: Path,
                 drops: Path | None = None) -> tuple[Digest, dict[str, Any]]:
    """Dedup and sort one bucket, cut it into leaves, and write its kept entries. `sources` are
    the parts' entries objects (or the runs merged from them) with their first part's ordinal,
    `parts` the parts' sources and line offsets in input order; with `drops` (a drops object),
    the bucket's near duplicates are removed after exact dedup."""
    gathered, blob = gather_bucket(sources, bucket, bits)
    documents_read = len(gathered)
    if documents_read and int(gathered["part"].max()) >= len(parts):  # fail closed, not an IndexError
        raise IntegrityError(f"bucket {bucket}: an entry names part {int(gathered['part'].max())}, "
                             f"but the corpus has {len(parts)} parts")
    entries, dropped = sort_and_dedup(gathered, exact)
    after_exact = entries["part"].copy()  # not a view: the exact-kept copy is freed below
    entries, near = _without_near(entries, gathered, drops, bucket, bits)
    quality = {"token_lengths": measure(entries["n_tokens"]).to_json(),
               "parts": part_counts(gathered["part"], after_exact, entries, near is not None)}
    del gathered, after_exact  # a bucket's entries are held once, plus the kept copy while sorting
    entries, ids = regroup_ids(entries, blob)  # entries is sort_and_dedup's own copy
    weights = (entries["n_tokens"].astype(np.int64) + 1) * itemsize
    root = bucket << (64 - bits) if bits else 0
    cuts = split_leaves(entries["key_hi"], weights, root, bits, shard_size)
    ranges = list(dict.fromkeys([(first, end) for _, _, first, end in cuts] + [(0, len(entries))]))
    digests = dict(zip(ranges, leaf_digests(entries, ids, parts, ranges)))  # a lone leaf is the bucket
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
               "digest": digests[0, len(entries)], "leaves": leaves, **quality}
    if near is not None:
        summary["near_duplicates_dropped"] = near
    return digest, summary


def part_counts(gathered: np.ndarray, after_exact: np.ndarray, kept: np.ndarray, near: bool) -> dict[str, list[int]]:
    """Per part (by ordinal) with documents in the bucket: duplicates exact dedup dropped, near
    duplicates dropped (with `near`), and the documents and tokens (EOS included) kept; from the
    part ordinals of the gathered entries, of those exact dedup kept, and the kept entries."""
    size = int(gathered.max()) + 1 if len(gathered) else 0
    arrived, exact_kept, written = (np.bincount(parts.astype(np.int64), minlength=size)
                                    for parts in (gathered, after_exact, kept["part"]))
    tokens = np.zeros(size, dtype=np.int64)
    np.add.at(tokens, kept["part"].astype(np.int64), kept["n_tokens"].astype(np.int64) + 1)
    present = np.flatnonzero(arrived)
    counts = {"part": present.tolist(), "duplicates": (arrived - exact_kept)[present].tolist(),
              "documents": written[present].tolist(), "tokens": tokens[present].tolist()}
    if near:
        counts["near_duplicates"] = (exact_kept - written)[present].tolist()
    return counts


def _without_near(entries: np.ndarray, gathered: np.ndarray, drops: Path | None, bucket: int,
                  bits: int) -> tuple[np.ndarray, int | None]:
    """The kept entries without the bucket's near-duplicate drops, and how many those removed
    (None without a drops object)."""
    if drops is None:
        return entries, None
    with descriptor(drops) as fd:
        records = open_drops(drops, fd).read_bucket(bucket, bits, fd)
    return drop_near_duplicates(entries, records, global_numbers(gathered["part"], gathered["row"]))
