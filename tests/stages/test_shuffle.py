"""Properties of the shuffle plan: a pure function of the seed and the kept documents, every
document placed exactly once, shards packed to the target size, offsets contiguous."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.formats import wds
from prep.stages.intermediate import IntermediateWriter
from prep.stages.shuffle import plan_shards, shuffle_keys
from prep.stages.specs import Part

DTYPE = np.dtype(np.uint16)


def _part(folder: Path, name: str, sizes: list[int]) -> Part:
    """An intermediate with one document per size (n tokens, distinct texts)."""
    texts = [f"{name}-{i}-" + "x" * n for i, n in enumerate(sizes)]
    hashes = [i.to_bytes(8, "little") + hash(t).to_bytes(8, "little", signed=True) for i, t in enumerate(texts)]
    path = folder / f"{name}.part"
    with IntermediateWriter(path, DTYPE) as writer:
        writer.write_batch(range(len(sizes)), [None] * len(sizes), [t.encode() for t in texts], hashes,
                           [False] * len(sizes), [np.zeros(n, DTYPE) for n in sizes])
    return Part(path, f"{name}.jsonl", "jsonl", 0, len(sizes))


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=12), min_size=1, max_size=4),
       shard_size=st.integers(1, 2000), seed=st.integers(0, 2**63), drop_every=st.integers(0, 3))
def test_plan_places_every_kept_document_once(sizes: list[list[int]], shard_size: int, seed: int,
                                               drop_every: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        parts = [_part(Path(folder), f"f{i}", s) for i, s in enumerate(sizes)]
        flat = np.asarray([n for s in sizes for n in s])
        keep = np.ones(len(flat), dtype=bool)
        if drop_every:
            keep[::drop_every + 1] = False
        plan, shards = plan_shards(parts, keep, seed, shard_size, DTYPE, ("bin", "wds"))
        again, _ = plan_shards(parts, keep, seed, shard_size, DTYPE, ("bin", "wds"))
    assert again.tobytes() == plan.tobytes()
    lengths = flat[keep] + 1  # tokens + EOS, in input order of the kept documents
    assert len(plan) == keep.sum()
    assert sorted(plan["pos"].tolist()) == list(range(len(plan)))
    assert [s.first_pos for s in shards] == [sum(x.documents for x in shards[:i]) for i in range(len(shards))]
    for spec in shards:
        mine = np.flatnonzero(plan["shard"] == spec.index)
        mine = mine[np.argsort(plan["pos"][mine])]
        assert plan["pos"][mine].tolist() == list(range(spec.first_pos, spec.first_pos + spec.documents))
        bytes_ = lengths[mine] * DTYPE.itemsize
        assert plan["bin_off"][mine].tolist() == (np.cumsum(bytes_) - bytes_).tolist()
        assert spec.bin_size == int(bytes_.sum()) and spec.tokens == int(lengths[mine].sum())
        assert spec.bin_size <= shard_size or spec.documents == 1  # only a lone oversized document exceeds it
        tar = plan["tar_off"][mine]
        assert tar[0] == 0 and np.all(np.diff(tar) >= 3 * 512) and np.all(tar % 512 == 0)
        assert spec.tar_size - len(wds.END_OF_ARCHIVE) > tar[-1]
    for left, right in zip(shards, shards[1:]):  # greedy: a shard closes only when the next document does not fit
        first = np.flatnonzero((plan["shard"] == right.index) & (plan["pos"] == right.first_pos))[0]
        assert left.bin_size + int(lengths[first]) * DTYPE.itemsize > shard_size


def test_order_depends_on_seed_and_content_not_position() -> None:
    hashes = np.random.default_rng(1).integers(0, 2**63, size=(50, 2), dtype=np.uint64)
    keys = shuffle_keys(hashes, 7)
    assert not np.array_equal(np.argsort(keys), np.arange(50))
    assert np.array_equal(shuffle_keys(hashes[::-1], 7), keys[::-1])
    assert not np.array_equal(shuffle_keys(hashes, 8), keys)
