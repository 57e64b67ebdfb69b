"""MinHash signatures of a batch of documents: normalize, split into words, shingle, hash.

The definitions (docs/build.md, "Near-duplicate removal"), each deciding snapshot ids:

* Normalization: Unicode NFC, then `str.lower()` (both of the running Python's Unicode version,
  `settings.UNICODE_VERSION`, which task keys record), then every run of whitespace folded to one space and
  the ends stripped. Whitespace is `WHITESPACE`, the 29 characters for which `str.isspace()` is
  true (tab, LF, VT, FF, CR, U+001C-U+001F, space, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
  U+2029, U+202F, U+205F, U+3000). ASCII text is lowered byte-wise, which is the same thing.
* Words: the maximal runs of non-whitespace characters. Punctuation is part of the word it touches
  ("end." and "end" are different words); nothing else separates words. (Folding whitespace thus
  changes no word: it is done implicitly, by splitting at every run.)
* Word hash: the word's UTF-8 bytes in 8-byte lanes q_0, q_1, ... (little-endian, the last one
  zero-padded); w = mix64((Σ_k mix64(q_k ⊕ (k + 1)·G)) ⊕ L) mod 2^64, L the byte length, G =
  0x9E3779B97F4A7C15, mix64 the splitmix64 finalizer (below).
* Shingles: each run of `ngram` consecutive words; a document of 1 to ngram - 1 words has one
  shingle of all its words; an empty one has none. Shingle hash: h = m, then h = h·G + w_j
  (mod 2^64) for each of its m words in order, then mix64(h).
* MinHash: permutation i is h_i(x) = (a_i·x mod 2^64) >> 32 (multiply-shift, Dietzfelbinger et
  al. 1997: a universal family, and a bijection before the shift, so it adds no collision of its
  own); a_0, a_1, ... are the first `permutations` outputs of numpy's PCG64 bit generator seeded
  with `seed` (`random_raw`: the bit generator's stream, fixed across numpy versions), each with
  its lowest bit set. Signature[i] = min over the document's shingles of h_i, as uint32; a
  document with no shingle has 0xFFFFFFFF everywhere. (The shift is taken after the minimum over
  64-bit products, which is the same, as the shift keeps order.)

Every step is per document, so a signature does not depend on the batch the document is in.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from prep.neardup import kernel
from prep.neardup.normalization import compiled_normalized, normalized

Array = np.ndarray[Any, Any]
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1, MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + \
    "\u2028\u2029\u202f\u205f\u3000"
"""What separates words: the characters for which `str.isspace()` is true (Unicode 6.3 to 15.1)."""
WIDE_WHITESPACE = {lead: tuple(code for char in WHITESPACE if (code := char.encode("utf-8"))[0] == lead)
                   for lead in sorted({char.encode("utf-8")[0] for char in WHITESPACE if not char.isascii()})}
"""The UTF-8 of the non-ASCII whitespace characters, by their first byte (0xC2, 0xE1, 0xE2, 0xE3)."""
ASCII_WHITESPACE_BYTE = re.compile(rb"[\t-\r\x1c- ]")
LANE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [2**64 - 1], dtype=np.uint64)
CHUNK_ELEMENTS = 1 << 17
"""MinHash products computed at once (1 MiB of uint64): a batch's memory does not grow with its shingles."""
SLICE_BYTES = 8 * 2**20
"""Text signed at once: the words, word and shingle hashes of a slice take about 11 times its bytes
(a larger document goes in pieces: a 41 MB one peaked at 146 MB, its normalized copy included)."""


@dataclass(frozen=True, eq=False)
class HashFamily:
    """The permutations' multipliers: odd uint64s, one per permutation."""

    multipliers: Array


@functools.cache
def hash_family(seed: int, permutations: int) -> HashFamily:
    """The `permutations` hash functions of `seed`: PCG64's raw outputs, each made odd."""
    return HashFamily(np.random.PCG64(seed).random_raw(permutations).astype(np.uint64) | np.uint64(1))


def signatures(blob: bytes, offsets: Array, ngram: int, permutations: int, seed: int) -> Array:
    """The MinHash signature of every document `blob[offsets[i]:offsets[i + 1]]` (UTF-8): shape
    (documents, permutations), uint32. Documents go through in slices of about `SLICE_BYTES`, so
    memory is that of a slice whatever the batch; a larger document alone, by the compiled kernels
    (prep.neardup.kernel: nothing of its size but its normalized copy) or by numpy in pieces."""
    offsets = np.asarray(offsets, dtype=np.int64)
    family = hash_family(seed, permutations)
    result = np.empty((len(offsets) - 1, permutations), dtype=np.uint32)
    kernels = kernel.chosen(len(blob) // kernel.BYTES_A_SHINGLE * permutations)
    view = memoryview(blob)
    for first, last in _slices(offsets):
        base, end = int(offsets[first]), int(offsets[last])
        text = blob if base == 0 and end == len(blob) else bytes(view[base:end])
        if kernels is not None:  # any size of document: the compiled pass holds no array of its size
            padded, text_offsets = compiled_normalized(kernels, text, offsets[first:last + 1] - base)
            kernels.text_minima(padded, kernel.lanes(padded), text_offsets, ngram, family.multipliers,
                                result[first:last])
        elif end - base > SLICE_BYTES:  # one document
            result[first] = _large_signature(text, ngram, family)
        else:
            shingles, bounds = shingle_hashes(text, offsets[first:last + 1] - base, ngram)
            result[first:last] = minhash(shingles, bounds, family)
    return result


def _large_signature(data: bytes, ngram: int, family: HashFamily) -> Array:
    """One document's signature, its normalized text taken in pieces cut at whitespace: each
    piece's words follow the last ngram - 1 words before it, so every shingle is seen."""
    text, _ = normalized(data, np.array([0, len(data)], dtype=np.int64))
    lows = np.full(len(family.multipliers), 0xFFFFFFFF, dtype=np.uint32)
    carried, count = np.zeros(0, dtype=np.uint64), 0
    for start, end in _pieces(text):
        piece = text[start:end]
        starts, lengths, _ = words(piece, np.array([0, len(piece)], dtype=np.int64))
        hashes = np.concatenate([carried, word_hashes(piece, starts, lengths)])
        count += len(starts)
        if len(hashes) >= ngram:
            runs = mix64(_runs(hashes, ngram))
            np.minimum(lows, minhash(runs, np.array([0, len(runs)]), family)[0], out=lows)
        carried = hashes[len(hashes) - min(ngram - 1, len(hashes)):]
    if 0 < count < ngram:  # fewer words than a shingle: they are all carried
        shingle = mix64(_short_runs(carried, np.zeros(1, dtype=np.int64), np.array([count])))
        lows = minhash(shingle, np.array([0, 1]), family)[0]
    return lows


def _pieces(text: bytes) -> Iterator[tuple[int, int]]:
    """Consecutive ranges of about `SLICE_BYTES` of `text`, each cut at an ASCII whitespace byte
    (which no word and no UTF-8 sequence holds), or at the end."""
    start = 0
    while start < len(text):
        found = ASCII_WHITESPACE_BYTE.search(text, start + SLICE_BYTES)
        end = found.start() if found else len(text)
        yield start, end
        start = end


def _slices(offsets: Array) -> Iterator[tuple[int, int]]:
    """Consecutive ranges of documents holding at most `SLICE_BYTES` of text, or one document."""
    first, count = 0, len(offsets) - 1
    while first < count:
        last = int(np.searchsorted(offsets, offsets[first] + SLICE_BYTES, "right")) - 1
        last = min(max(last, first + 1), count)
        yield first, last
        first = last


def shingle_hashes(blob: bytes, offsets: Array, ngram: int) -> tuple[Array, Array]:
    """Every document's shingle hashes (uint64, in text order, repeats kept), one document after
    another, and where each document's start (documents + 1 int64)."""
    text, text_offsets = normalized(blob, offsets)
    starts, lengths, word_bounds = words(text, text_offsets)
    return shingles(word_hashes(text, starts, lengths), word_bounds, ngram)


def packed(texts: Sequence[bytes]) -> tuple[bytes, Array]:
    """UTF-8 texts as one buffer and its offsets (int64, one more than texts), as every function
    here takes a batch."""
    lengths = np.fromiter((len(text) for text in texts), dtype=np.int64, count=len(texts))
    return b"".join(texts), np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])


def shingle_sets(blob: bytes, offsets: Array, ngram: int) -> list[Array]:
    """Each document's distinct shingle hashes, sorted (what `lsh.jaccard` compares)."""
    hashes, bounds = shingle_hashes(blob, offsets, ngram)
    return [np.unique(hashes[start:end]) for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def words(text: bytes, offsets: Array) -> tuple[Array, Array, Array]:
    """Every word's start and byte length (int64) in `text` (normalized), and where each
    document's words start (documents + 1): words never cross a document's end."""
    codes = np.frombuffer(text, dtype=np.uint8)
    # ASCII whitespace is 9-13 and 28-32: two wrapping subtractions find both ranges
    solid = ((codes - np.uint8(9)) > 4) & ((codes - np.uint8(28)) > 4)
    if not text.isascii():
        _clear_wide_whitespace(codes, solid)
    bordered = np.zeros(len(solid) + 2, dtype=bool)
    bordered[1:-1] = solid
    edges = np.flatnonzero(bordered[1:] != bordered[:-1])  # (on bools: numpy's fast nonzero)
    starts, ends = edges[0::2], edges[1::2]  # a run of solid bytes starts, then ends, in turn
    inner = offsets[1:-1]
    inner = np.unique(inner[(inner > 0) & (inner < len(text))])  # empty documents repeat an offset
    joined = inner[solid[inner - 1] & solid[inner]]  # a word running on into the next document
    if len(joined):
        starts = np.insert(starts, np.searchsorted(starts, joined), joined)
        ends = np.insert(ends, np.searchsorted(ends, joined), joined)
    return starts, ends - starts, np.searchsorted(starts, offsets).astype(np.int64)


def _clear_wide_whitespace(codes: Array, solid: Array) -> None:
    """Mark the bytes of every non-ASCII whitespace character in `solid` as not solid."""
    padded = np.concatenate([codes, np.zeros(3, dtype=np.uint8)])
    candidates = np.flatnonzero((codes == 0xC2) | ((codes - np.uint8(0xE1)) <= 2))  # every lead of WIDE_WHITESPACE
    for lead, encodings in WIDE_WHITESPACE.items():
        leads = candidates[codes[candidates] == lead]
        for encoded in encodings:
            found = leads
            for offset in range(1, len(encoded)):
                found = found[padded[found + offset] == encoded[offset]]
            for offset in range(len(encoded)):
                solid[found + offset] = False


def mix64(values: Array) -> Array:
    """splitmix64's finalizer on every uint64 of `values` (in place; returned): a bijection whose
    every output bit depends on every input bit."""
    shifted = np.empty_like(values)
    for shift, multiplier in ((30, MIX1), (27, MIX2)):
        values ^= np.right_shift(values, np.uint64(shift), out=shifted)
        values *= multiplier
    values ^= np.right_shift(values, np.uint64(31), out=shifted)
    return values


def word_hashes(text: bytes, starts: Array, lengths: Array) -> Array:
    """The hash of each word `text[starts[i]:starts[i] + lengths[i]]` (module docstring), uint64."""
    windows = np.ndarray(shape=(len(text),), dtype="<u8", buffer=text + bytes(8), strides=(1,))  # 8 bytes at each offset
    sums = windows[starts] & LANE_MASKS[np.minimum(lengths, 8)]
    sums ^= GOLDEN
    mix64(sums)
    long = np.flatnonzero(lengths > 8)
    if len(long):  # their lanes after the first, all at once
        lanes = (lengths[long] - 1) // 8
        first_lane = np.zeros(len(long) + 1, dtype=np.int64)
        np.cumsum(lanes, out=first_lane[1:])
        owner = np.repeat(np.arange(len(long)), lanes)
        index = np.arange(first_lane[-1], dtype=np.int64) - first_lane[:-1][owner] + 1
        values = windows[starts[long][owner] + 8 * index] & LANE_MASKS[np.minimum(lengths[long][owner] - 8 * index, 8)]
        values ^= (index.astype(np.uint64) + np.uint64(1)) * GOLDEN
        sums[long] += np.add.reduceat(mix64(values), first_lane[:-1])
    sums ^= lengths.astype(np.uint64)
    return mix64(sums)


def shingles(hashes: Array, bounds: Array, ngram: int) -> tuple[Array, Array]:
    """The shingle hashes (module docstring) of documents whose word hashes are
    `hashes[bounds[d]:bounds[d + 1]]`, and where each document's shingles start."""
    counts = np.diff(bounds)
    per_document = np.where(counts >= ngram, counts - ngram + 1, np.minimum(counts, 1))
    shingle_bounds = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(per_document, out=shingle_bounds[1:])
    owner = np.repeat(np.arange(len(counts)), per_document)
    first = bounds[:-1][owner] + np.arange(shingle_bounds[-1], dtype=np.int64) - shingle_bounds[:-1][owner]
    short = np.flatnonzero(counts[owner] < ngram)
    result = _runs(hashes, ngram)[np.minimum(first, max(len(hashes) - ngram, 0))] if len(hashes) >= ngram else \
        np.zeros(len(first), dtype=np.uint64)
    if len(short):
        result[short] = _short_runs(hashes, first[short], counts[owner[short]])
    return mix64(result), shingle_bounds


def _runs(hashes: Array, ngram: int) -> Array:
    """The unmixed hash of every run of `ngram` consecutive words of the batch (those crossing a
    document's end are computed and never used): slices, no gathers."""
    count = len(hashes) - ngram + 1
    result = np.full(count, ngram, dtype=np.uint64)
    for j in range(ngram):
        result *= GOLDEN
        result += hashes[j:j + count]
    return result


def _short_runs(hashes: Array, first: Array, size: Array) -> Array:
    """The unmixed hash of the one shingle of each document with fewer words than a shingle."""
    result = size.astype(np.uint64)
    for j in range(int(size.max())):
        grown = result * GOLDEN + hashes[np.minimum(first + j, len(hashes) - 1)]
        result = np.where(j < size, grown, result)
    return result


def minhash(shingle_hashes: Array, bounds: Array, family: HashFamily) -> Array:
    """Signatures (documents x permutations, uint32) of documents whose shingle hashes are
    `shingle_hashes[bounds[d]:bounds[d + 1]]`: by the compiled kernel when it is loaded or the
    batch is large enough to pay for loading it (prep.neardup.kernel), else by numpy."""
    kernels = kernel.chosen(len(shingle_hashes) * len(family.multipliers))
    if kernels is None:
        return numpy_minhash(shingle_hashes, bounds, family)
    lows = np.empty((len(bounds) - 1, len(family.multipliers)), dtype=np.uint64)
    kernels.minima(np.ascontiguousarray(shingle_hashes, dtype=np.uint64), np.ascontiguousarray(bounds, dtype=np.int64),
                   family.multipliers, lows)
    return (lows >> np.uint64(32)).astype(np.uint32)


def numpy_minhash(shingle_hashes: Array, bounds: Array, family: HashFamily) -> Array:
    """`minhash` in numpy, `CHUNK_ELEMENTS` products at a time (what runs without numba)."""
    permutations = len(family.multipliers)
    lows = np.full((permutations, len(bounds) - 1), np.iinfo(np.uint64).max, dtype=np.uint64)
    present = np.flatnonzero(np.diff(bounds) > 0)
    firsts = bounds[:-1][present]
    step = max(1, CHUNK_ELEMENTS // permutations)
    buffer = np.empty((permutations, step), dtype=np.uint64)
    multipliers = family.multipliers[:, None]
    for start in range(0, len(shingle_hashes), step):
        stop = min(start + step, len(shingle_hashes))
        products = buffer[:, :stop - start]
        np.multiply(multipliers, shingle_hashes[None, start:stop], out=products)
        first, last = np.searchsorted(firsts, start, "right") - 1, np.searchsorted(firsts, stop, "left")
        documents = present[first:last]
        segment_starts = np.maximum(firsts[first:last], start) - start
        lows[:, documents] = np.minimum(lows[:, documents], np.minimum.reduceat(products, segment_starts, axis=1))
    return np.ascontiguousarray((lows >> np.uint64(32)).astype(np.uint32).T)
