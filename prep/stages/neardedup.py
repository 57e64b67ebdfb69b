"""Near-duplicate removal's task bodies (issue 42), pure of stores and runners: a tokenize batch's
band hashes, a band bucket's candidate pairs, and the order task's filter of its bucket by the
drops. The clusters are joined in partitioned rounds between them (prep/stages/starrounds.py).

A document is named by its global number `part ordinal << 32 | row`, `row` being the record's row
in its part, as entries and intermediates name it: numbers follow input order, so a cluster's
smallest is its first document, the one kept, whatever the split into parts or buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.neardup.lsh import band_hashes, distinct_pairs, pair_jaccards
from prep.neardup.settings import NearDupSettings
from prep.neardup.signatures import packed, signatures
from prep.workfiles.bands import BAND_DTYPE, open_bands
from prep.workfiles.drops import DROP_DTYPE
from prep.workfiles.entries import descriptor, take_entries
from prep.workfiles.intermediate import read_text_sizes, read_texts
from prep.workfiles.pairs import CandidatePairs

Array = np.ndarray[Any, Any]
Similar = Callable[[Array, Array], Array]
"""Whether each pair (left[i], right[i]) of global numbers is truly similar: a bool mask."""
VERIFY_BYTES = 8 * 2**20
"""Text `verify` reads and shingles at once (about 15 times it while shingling: docs/build.md,
"Near-duplicate removal"): a band bucket's pairs are checked in slices of it, whatever they name."""
DOCUMENT_BYTES = 128
"""Charged per document beside its text against VERIFY_BYTES (its shingle set and their list), so
a slice of many empty or tiny texts is bounded too."""


def global_numbers(parts: Array, rows: Array) -> Array:
    """Each document's global number, `part ordinal << 32 | row` (int64: ordinals stay below 2**31)."""
    return (np.asarray(parts, dtype=np.int64) << 32) | np.asarray(rows, dtype=np.int64)


def batch_bands(blob: bytes, offsets: Array, settings: NearDupSettings) -> Array:
    """The band hashes (documents x bands, uint64) of a tokenize batch's texts `blob[offsets[i]:offsets[i + 1]]`."""
    sigs = signatures(blob, offsets, settings.ngram, settings.permutations, settings.seed)
    return band_hashes(sigs, settings.bands, settings.rows)


def gather_bands(sources: Sequence[tuple[Path, int]], bucket: int, bits: int) -> list[tuple[int, Array]]:
    """Bucket `bucket` of `2**bits` of every part's bands object, with its part's ordinal (one read each)."""
    def read(path: Path) -> Array:
        with descriptor(path) as fd:
            return open_bands(path, fd).read_bucket(bucket, bits, fd)

    return [(ordinal, read(path)) for path, ordinal in sources]


def bucket_pairs(pieces: Iterable[tuple[int, Array]], similar: Similar | None = None) -> CandidatePairs:
    """The candidate pairs of one band bucket: band records (BAND_DTYPE) of each part, with its
    ordinal. Documents sharing a hash are paired with the first of them (a star joins them as a
    clique would); with `similar`, a member it rejects is paired among the rejected ones instead,
    first with the first of them, round after round."""
    hashes, documents, keys = _numbered(pieces)
    order = np.lexsort((documents, hashes))
    hashes, documents = hashes[order], documents[order]
    fresh = np.ones(len(order), dtype=bool)
    fresh[1:] = (hashes[1:] != hashes[:-1]) | (documents[1:] != documents[:-1])  # a hash twice in one document
    hashes, documents = hashes[fresh], documents[fresh]
    group = np.cumsum(np.concatenate([[True], hashes[1:] != hashes[:-1]])) - 1 if len(hashes) else hashes
    left, right = _stars(documents, np.asarray(group, dtype=np.int64), similar)
    return _with_keys(*distinct_pairs(left, right), documents=documents, keys=keys[order][fresh])


def _numbered(pieces: Iterable[tuple[int, Array]]) -> tuple[Array, Array, Array]:
    """The hashes, global numbers and order key high words of every part's band records."""
    kept = [(ordinal, records) for ordinal, records in pieces if len(records)]
    if not kept:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
    records = np.concatenate([records.astype(BAND_DTYPE) for _, records in kept])
    parts = np.concatenate([np.full(len(records), ordinal, dtype=np.int64) for ordinal, records in kept])
    return records["hash"], global_numbers(parts, records["row"]), records["key_hi"]


def _stars(documents: Array, group: Array, similar: Similar | None) -> tuple[Array, Array]:
    """Pairs (first pending member of its group, each other pending member), round by round: a
    member paired (or a first) leaves; without `similar` every member is paired in one round."""
    pending = np.ones(len(documents), dtype=bool)
    lefts, rights = [], []
    while True:
        at = np.flatnonzero(pending)
        first = np.concatenate([[True], group[at][1:] != group[at][:-1]]) if len(at) else np.zeros(0, dtype=bool)
        leader = at[first][np.cumsum(first) - 1]
        members = at[~first]
        if not len(members):
            break
        left, right = documents[leader[~first]], documents[members]
        accepted = np.ones(len(members), dtype=bool) if similar is None else np.asarray(similar(left, right), dtype=bool)
        lefts.append(left[accepted])
        rights.append(right[accepted])
        pending[at[first]] = False
        pending[members[accepted]] = False
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate(lefts or [empty]), np.concatenate(rights or [empty])


def _with_keys(left: Array, right: Array, documents: Array, keys: Array) -> CandidatePairs:
    """The pairs with the documents they name and those documents' order key high words."""
    named, at = np.unique(documents, return_index=True)
    used = np.isin(named, np.concatenate([left, right]))
    return CandidatePairs(left.astype(np.uint64), right.astype(np.uint64), named[used].astype(np.uint64),
                          keys[at][used].astype(np.uint64))


def jaccard_filter(texts_of: Callable[[Array], Sequence[bytes]], sizes_of: Callable[[Array], Array], ngram: int,
                   threshold: float) -> Similar:
    """`verify`'s test of candidate pairs: their true Jaccard on shingles (`lsh.jaccard` of
    `signatures.shingle_sets`) is at least `threshold`. `texts_of` gives the UTF-8 texts of
    distinct, sorted global numbers and `sizes_of` their byte sizes (the wiring reads both from
    the intermediates). Each distinct pair is checked once (a pair sharing several bands of the
    bucket comes once a band), in order of its documents, in slices of `VERIFY_BYTES`
    (`budget_slices`), so a call holds that much text, not all its pairs name; each pair's answer
    is its own either way."""
    def similar(left: Array, right: Array) -> Array:
        left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
        named = np.unique(np.concatenate([left, right]))
        charged = np.asarray(sizes_of(named), dtype=np.int64) + DOCUMENT_BYTES
        joined = np.searchsorted(named, left).astype(np.uint64) << np.uint64(32) | \
            np.searchsorted(named, right).astype(np.uint64)  # a round names under 2**32 documents
        distinct, back = np.unique(joined, return_inverse=True)
        at_left, at_right = (distinct >> np.uint64(32)).astype(np.int64), (distinct & np.uint64(0xFFFFFFFF)).astype(np.int64)
        accepted = np.zeros(len(distinct), dtype=bool)
        for low, high in budget_slices(at_left, at_right, charged, VERIFY_BYTES):
            accepted[low:high] = _jaccard_at_least(texts_of, named[at_left[low:high]], named[at_right[low:high]], ngram,
                                                   threshold)
        verdicts: Array = accepted[back.reshape(-1)]
        return verdicts

    return similar


def budget_slices(at_left: Array, at_right: Array, sizes: Array, budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges [low, high) of the pairs (at_left[i], at_right[i]) of documents, indexes
    into `sizes`, whose distinct documents' sizes add up to at most `budget`; a pair over it alone."""
    weights = sizes.tolist()
    low, held, seen = 0, 0, set[int]()
    for index, pair in enumerate(zip(at_left.tolist(), at_right.tolist())):
        fresh = set(pair) - seen
        if seen and held + sum(weights[document] for document in fresh) > budget:
            yield low, index
            low, held, seen, fresh = index, 0, set[int](), set(pair)
        seen |= fresh
        held += sum(weights[document] for document in fresh)
    if len(at_left):
        yield low, len(at_left)


def _jaccard_at_least(texts_of: Callable[[Array], Sequence[bytes]], left: Array, right: Array, ngram: int,
                      threshold: float) -> Array:
    """Whether each pair's true Jaccard reaches `threshold`, the texts of the documents they name read at once."""
    named = np.unique(np.concatenate([left, right]))
    values = pair_jaccards(*packed(texts_of(named)), ngram, np.searchsorted(named, left), np.searchsorted(named, right))
    return np.asarray(values >= threshold, dtype=bool)


def texts_by_number(intermediate_of: Callable[[int], Path], numbers: Array) -> list[bytes]:
    """The texts of sorted global numbers, read part by part from the intermediates
    (`intermediate_of(ordinal)`): what `jaccard_filter` compares, one slice of a bucket's pairs at a time."""
    return [text for ordinal, rows in _by_part(numbers) for text in read_texts(intermediate_of(ordinal), rows)]


def sizes_by_number(intermediate_of: Callable[[int], Path], numbers: Array) -> Array:
    """The text byte sizes of sorted global numbers, from the intermediates' spans (no text read)."""
    sizes = [read_text_sizes(intermediate_of(ordinal), rows) for ordinal, rows in _by_part(numbers)]
    return np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)


def _by_part(numbers: Array) -> Iterator[tuple[int, Array]]:
    """Each part ordinal sorted global numbers name, with their rows in it."""
    numbers = np.asarray(numbers, dtype=np.int64)
    parts = numbers >> 32
    for ordinal in np.unique(parts).tolist():
        yield ordinal, numbers[parts == ordinal] & 0xFFFFFFFF


def drop_near_duplicates(kept: Array, drops: Array, gathered: Array | None = None) -> tuple[Array, int]:
    """An order bucket's entries kept by exact dedup (ENTRY_DTYPE, `part` the part's ordinal)
    without the bucket's near-duplicate drops (DROP_DTYPE), and how many that removed: a drop
    exact dedup removed already is not counted again. With `gathered` (the global numbers of
    every entry the bucket gathered), a drop naming none of them is an IntegrityError."""
    drops = np.asarray(drops, dtype=DROP_DTYPE)
    named = np.sort(drops["document"].astype(np.int64))
    if gathered is not None and len(named) and not np.isin(named, gathered).all():
        raise IntegrityError("a near-duplicate drop names a document this bucket never gathered")
    numbers = global_numbers(kept["part"], kept["row"])
    hit = np.isin(numbers, named)
    by_number = drops[np.argsort(drops["document"], kind="stable")]
    keys = by_number["key_hi"][np.searchsorted(named, numbers[hit])]
    if not np.array_equal(keys, kept["key_hi"][hit]):
        raise IntegrityError("a near-duplicate drop's order key is not its document's")
    return take_entries(kept, np.flatnonzero(~hit)), int(hit.sum())
