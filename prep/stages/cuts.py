"""Content-defined shards over the whole key space, from the buckets' own cuts.

A shard is one leaf of a binary trie over the 64-bit high half of the order key: a key range is
halved at its midpoint while its token bytes exceed `shard_size` and it holds more than one
document. Below the bucket depth each bucket has cut itself (prep.stages.order.split_leaves);
above it, ranges spanning several buckets are decided here from bucket totals. A shard's range,
name and bytes therefore depend only on the documents inside it and on its parent's total, never
on the bucket count, the worker count or any position in the corpus. Pure Python: the build
driver runs it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from prep.workfiles.shardplan import ShardPlan

MAX_BUCKET_BITS = 20


def bucket_bits(documents: int, per_bucket: int) -> int:
    """How many key bits split `documents` into buckets of at most about `per_bucket` each."""
    bits = 0
    while documents > per_bucket << bits and bits < MAX_BUCKET_BITS:
        bits += 1
    return bits


def plan_shards(buckets: list[dict[str, Any]], bits: int, shard_size: int) -> list[ShardPlan]:
    """Every shard in key order, from the order tasks' summaries (one per bucket, in bucket order)."""
    if len(buckets) != 1 << bits:
        raise ValueError(f"expected {1 << bits} bucket summaries, got {len(buckets)}")
    levels: list[list[tuple[int, int]]] = [[(int(b["documents"]), int(b["bin_size"])) for b in buckets]]
    for _ in range(bits):
        below = levels[0]
        levels.insert(0, [(below[i][0] + below[i + 1][0], below[i][1] + below[i + 1][1])
                          for i in range(0, len(below), 2)])
    found: list[dict[str, Any]] = []
    stack = [(0, 0)]
    while stack:
        depth, index = stack.pop()
        documents, size = levels[depth][index]
        if documents == 0:
            continue
        if depth == bits:
            found.extend({**leaf, "slices": ((index, leaf["first"], leaf["count"]),)} for leaf in buckets[index]["leaves"])
        elif size <= shard_size or documents <= 1:
            found.append(_spanning(buckets, bits, depth, index))
        else:
            stack.extend([(depth + 1, 2 * index + 1), (depth + 1, 2 * index)])
    return [ShardPlan(i, int(leaf["start"], 16), int(leaf["depth"]), tuple(leaf["slices"]), int(leaf["count"]),
                      int(leaf["tokens"]), int(leaf["bin_size"]), int(leaf["text_bytes"]), str(leaf["digest"]))
            for i, leaf in enumerate(found)]


def _spanning(buckets: list[dict[str, Any]], bits: int, depth: int, index: int) -> dict[str, Any]:
    """A shard covering whole buckets: node `index` at `depth` above the bucket depth."""
    width = 1 << (bits - depth)
    covered = [j for j in range(index * width, (index + 1) * width) if buckets[j]["documents"]]
    whole = [buckets[j] for j in covered]
    digest = hashlib.sha256("".join(b["digest"] for b in whole).encode()).hexdigest() if len(whole) > 1 \
        else whole[0]["digest"]
    return {"start": f"{index << (64 - depth) if depth else 0:016x}", "depth": depth,
            "slices": tuple((j, 0, int(buckets[j]["documents"])) for j in covered),
            "count": sum(int(b["documents"]) for b in whole), "tokens": sum(_tokens(b) for b in whole),
            "bin_size": sum(int(b["bin_size"]) for b in whole), "text_bytes": sum(int(b["text_bytes"]) for b in whole),
            "digest": digest}


def _tokens(bucket: dict[str, Any]) -> int:
    return sum(int(leaf["tokens"]) for leaf in bucket["leaves"])
