"""LSH banding over MinHash signatures: band hashes, the candidate pairs they give, similarities.

A band hash is 64 bits: two documents share a bucket by accident with probability about 2^-64
per band and pair, so even 10^9 documents in 16 bands give under one accidental pair in
expectation (and `verify` would drop it); 128 bits would double what a bucket task reads for
nothing measurable. Band b's hash of rows v_0 .. v_{r-1} (uint32) packs them two by two into
uint64 p_k = v_{2k} | v_{2k+1} << 32 (an odd last one alone), then h = mix64((b + 1)·G) and
h = mix64(h ⊕ p_k) for each pack in order (G and mix64 as in `signatures`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prep.neardup import kernel
from prep.neardup.normalization import compiled_normalized
from prep.neardup.signatures import GOLDEN, mix64, shingle_sets

Array = np.ndarray[Any, Any]


def band_hashes(signatures: Array, bands: int, rows: int) -> Array:
    """Each document's hash of each band (module docstring): shape (documents, bands), uint64."""
    if signatures.shape[1] != bands * rows:
        raise ValueError(f"signatures have {signatures.shape[1]} values, not bands x rows = {bands * rows}")
    values = signatures.astype(np.uint64).reshape(len(signatures), bands, rows)
    packs = values[:, :, 0::2].copy()
    packs[:, :, :rows // 2] |= values[:, :, 1::2] << np.uint64(32)
    hashes = np.broadcast_to(mix64((np.arange(bands, dtype=np.uint64) + np.uint64(1)) * GOLDEN),
                             (len(signatures), bands)).copy()
    for pack in range(packs.shape[2]):
        hashes ^= packs[:, :, pack]
        mix64(hashes)
    return hashes


def candidate_pairs(hashes: Array, documents: Array) -> tuple[Array, Array]:
    """Pairs (first, other) of documents sharing a bucket in some band, where `first` is the
    smallest document number of that bucket (a star: it joins a bucket as a clique would), each
    pair once, sorted. `hashes` is `band_hashes` of `documents` (int64 document numbers)."""
    keys = hashes.ravel()
    order = np.argsort(keys)
    keys, members = keys[order], np.repeat(np.asarray(documents, dtype=np.int64), hashes.shape[1])[order]
    starts = np.ones(len(keys), dtype=bool)
    starts[1:] = keys[1:] != keys[:-1]
    firsts = np.flatnonzero(starts)
    leaders = np.minimum.reduceat(members, firsts)[np.cumsum(starts) - 1] if len(keys) else members
    joined = members != leaders
    return distinct_pairs(leaders[joined], members[joined])


def distinct_pairs(left: Array, right: Array) -> tuple[Array, Array]:
    """The pairs (left[i], right[i]) of non-negative document numbers, sorted, each once."""
    if len(left) and max(int(left.max()), int(right.max())) < 2**32:  # both in one uint64: one plain sort
        joined = np.sort((left.astype(np.uint64) << np.uint64(32)) | right.astype(np.uint64))
        joined = joined[np.concatenate([[True], joined[1:] != joined[:-1]])]  # (np.unique hashes first: slower)
        return (joined >> np.uint64(32)).astype(np.int64), (joined & np.uint64(2**32 - 1)).astype(np.int64)
    order = np.lexsort((right, left))
    left, right = left[order], right[order]
    new = np.ones(len(left), dtype=bool)
    new[1:] = (left[1:] != left[:-1]) | (right[1:] != right[:-1])
    return left[new], right[new]


def jaccard(a_shingles: Array, b_shingles: Array) -> float:
    """|A ∩ B| / |A ∪ B| of two sets of distinct shingle hashes (`signatures.shingle_sets`); two
    empty documents are alike (1.0), as their signatures are."""
    if not len(a_shingles) and not len(b_shingles):
        return 1.0
    common = len(np.intersect1d(a_shingles, b_shingles, assume_unique=True))
    return common / (len(a_shingles) + len(b_shingles) - common)


def pair_jaccards(blob: bytes, offsets: Array, ngram: int, left: Array, right: Array) -> Array:
    """The exact Jaccard (float64) of each pair of documents left[i], right[i] (indexes into the
    batch `blob[offsets[d]:offsets[d + 1]]`) on their distinct shingle hashes: `jaccard` of
    `signatures.shingle_sets`, by the compiled pass when the kernels are loaded or the batch
    repays loading them (about 4 bytes of scratch a byte of text, against numpy's 15)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
    kernels = kernel.chosen_for_text(len(blob))
    if kernels is None:
        sets = shingle_sets(blob, offsets, ngram)
        return np.array([jaccard(sets[a], sets[b]) for a, b in zip(left.tolist(), right.tolist())], dtype=np.float64)
    padded, text_offsets = compiled_normalized(kernels, blob, offsets)
    out = np.empty(len(left), dtype=np.float64)
    kernels.pair_jaccards(padded, kernel.lanes(padded), text_offsets, ngram, left, right, out)
    return out


def estimated_similarity(sig_a: Array, sig_b: Array) -> float:
    """The share of permutations whose minimum two signatures have in common: Jaccard's estimate."""
    return float(np.count_nonzero(sig_a == sig_b)) / len(sig_a)
