"""Shuffle and shard planning: a pure function of the seed and the deduplicated documents.

Each kept document's place is decided by a keyed hash of its text hash, so the order does not
depend on worker count or task boundaries. The plan fixes every output byte offset in advance,
which lets shard assembly write documents at their final offsets in any order.
Memory: a few dozen bytes per document, no texts.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.formats import wds
from prep.formats.units import WDS
from prep.stages.columns import to_numbers, to_strings
from prep.stages.intermediate import hash_pairs, read_columns
from prep.stages.specs import Part, ShardSpec

PLAN_DTYPE = np.dtype([("shard", "<i4"), ("pos", "<i8"), ("bin_off", "<i8"), ("tar_off", "<i8")])
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def shuffle_keys(hashes: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit sort key per document, from its 128-bit text hash and the seed."""
    seed_mix = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    return _splitmix64(hashes[:, 0] ^ _splitmix64(hashes[:, 1] ^ seed_mix))


def record_line(fmt: str, line_offset: int, row: int) -> int:
    """The 1-based line (JSON Lines) or record number (Parquet, Arrow; 1 for a text file)."""
    return line_offset + row + 1


def document_id(doc_id: str | None, source: str, line: int) -> str:
    """The recorded id, or `<source>:<line>` when the pipeline has no id field."""
    return doc_id if doc_id is not None else f"{source}:{line}"


@dataclass(frozen=True)
class _Columns:
    hashes: np.ndarray
    seq_lengths: np.ndarray
    text_bytes: np.ndarray
    json_sizes: np.ndarray


def _read_columns(parts: list[Part], keep: np.ndarray, with_json: bool) -> _Columns:
    hashes, lengths, text_bytes, json_sizes = [], [], [], []
    offset = 0
    for part in parts:
        columns = ["text_hash", "n_tokens", "text_bytes"] + (["row", "id"] if with_json else [])
        table = read_columns(part.path, columns)
        mask = keep[offset:offset + table.num_rows]
        offset += table.num_rows
        hashes.append(hash_pairs(table.column("text_hash"))[mask])
        n_tokens = to_numbers(table.column("n_tokens"))
        lengths.append(n_tokens[mask].astype(np.int64) + 1)
        text_bytes.append(to_numbers(table.column("text_bytes"))[mask])
        if with_json:
            rows = to_numbers(table.column("row"))[mask]
            ids = np.asarray(to_strings(table.column("id")), dtype=object)[mask]
            sizes = [len(wds.sample_json(document_id(i, part.source, record_line(part.format, part.line_offset, int(r))),
                                         part.source, record_line(part.format, part.line_offset, int(r)), int(n)))
                     for i, r, n in zip(ids, rows, n_tokens[mask] + 1)]
            json_sizes.append(np.asarray(sizes, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return _Columns(
        hashes=np.concatenate(hashes) if hashes else np.zeros((0, 2), np.uint64),
        seq_lengths=np.concatenate(lengths) if lengths else empty,
        text_bytes=np.concatenate(text_bytes) if text_bytes else empty,
        json_sizes=np.concatenate(json_sizes) if json_sizes else empty,
    )


def plan_shards(parts: list[Part], keep: np.ndarray, seed: int, shard_size: int,
                dtype: np.dtype[Any], formats: tuple[str, ...]) -> tuple[np.ndarray, list[ShardSpec]]:
    """Place every kept document: its shard, global position and byte offsets in each format."""
    with_wds = WDS in formats
    itemsize = dtype.itemsize
    cols = _read_columns(parts, keep, with_wds)
    count = len(cols.seq_lengths)
    order = np.argsort(shuffle_keys(cols.hashes, seed), kind="stable")
    seq = cols.seq_lengths[order]
    bytes_cum = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(seq * itemsize, out=bytes_cum[1:])
    tar_cum = np.zeros(count + 1, dtype=np.int64)
    if with_wds:
        spans = wds.sample_spans(cols.json_sizes[order], wds.npy_sizes(seq, dtype), cols.text_bytes[order])
        np.cumsum(spans, out=tar_cum[1:])
    plan = np.zeros(count, dtype=PLAN_DTYPE)
    shards: list[ShardSpec] = []
    start = 0
    while start < count:
        end = int(np.searchsorted(bytes_cum, bytes_cum[start] + shard_size, side="right")) - 1
        end = max(end, start + 1)  # a document larger than shard_size gets a shard of its own
        chosen = order[start:end]
        plan["shard"][chosen] = len(shards)
        plan["pos"][chosen] = np.arange(start, end)
        plan["bin_off"][chosen] = bytes_cum[start:end] - bytes_cum[start]
        plan["tar_off"][chosen] = tar_cum[start:end] - tar_cum[start]
        shards.append(ShardSpec(
            index=len(shards), first_pos=start, documents=end - start,
            tokens=int(seq[start:end].sum()),
            bin_size=int(bytes_cum[end] - bytes_cum[start]),
            tar_size=int(tar_cum[end] - tar_cum[start]) + len(wds.END_OF_ARCHIVE) if with_wds else 0,
        ))
        start = end
    return plan, shards


def plan_bytes(plan: np.ndarray) -> bytes:
    """Deterministic bytes of a plan (.npy, version 1.0)."""
    buffer = io.BytesIO()
    np.save(buffer, plan, allow_pickle=False)
    return buffer.getvalue()


def plan_from_bytes(data: bytes) -> np.ndarray[Any, Any]:
    return np.load(io.BytesIO(data), allow_pickle=False)  # type: ignore[no-any-return]
