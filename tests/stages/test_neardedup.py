"""Near-duplicate task bodies end to end, on files: bands per part, every band bucket's pairs,
clusters, drops, and the order task's filter. Planted near duplicates are found, verify keeps
clusters tight, chains join under their first document, and the drops are the same documents
whatever the bucket count and the split into parts; verify reads a bucket's texts a budget at a
time and accepts the same pairs whatever the budget."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.neardup import lsh
from prep.neardup.lsh import jaccard
from prep.neardup.settings import NearDupSettings
from prep.neardup.signatures import shingle_sets
from prep.stages import neardedup
from prep.stages.neardedup import (
    batch_bands,
    bucket_pairs,
    budget_slices,
    drop_near_duplicates,
    gather_bands,
    global_numbers,
    jaccard_filter,
)
from prep.stages.order import sort_and_dedup
from prep.workfiles.bands import BAND_DTYPE, BandsWriter
from prep.workfiles.drops import DROP_DTYPE, drop_records, open_drops
from prep.workfiles.entries import ENTRY_DTYPE
from prep.workfiles.pairs import write_pairs
from tests.neardup.neardupsupport import batch, document, edited, local_drops

Array = np.ndarray[Any, Any]
SETTINGS = NearDupSettings(threshold=0.8, bands=16, rows=8)
BATCH = 37  # documents per tokenize batch


def key_hi(text: str) -> int:
    """A stand-in order key high word: a hash of the text (equal texts, equal keys)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Split:
    """A corpus cut into parts at `cuts` (input order kept): global numbers to corpus positions and back."""

    texts: list[str]
    cuts: tuple[int, ...]

    def parts(self) -> list[tuple[int, int]]:
        bounds = [0, *self.cuts, len(self.texts)]
        return list(zip(bounds[:-1], bounds[1:]))

    def position(self, number: int) -> int:
        return self.parts()[number >> 32][0] + (number & 0xFFFFFFFF)

    def texts_of(self, numbers: Array) -> list[bytes]:
        return [self.texts[self.position(int(number))].encode() for number in numbers]

    def sizes_of(self, numbers: Array) -> Array:
        return np.array([len(text) for text in self.texts_of(numbers)], dtype=np.int64)


def run(split: Split, tmp: Path, bits: int, verify: bool, settings: NearDupSettings = SETTINGS,
        range_bits: int = 0) -> tuple[Array, bytes]:
    """The drops of the whole flow (corpus positions: document, representative) and the drops object's bytes."""
    tmp.mkdir(parents=True)
    sources = []
    for ordinal, (start, end) in enumerate(split.parts()):
        writer = BandsWriter(tmp / f"{ordinal}.bands", settings.bands)
        for low in range(start, end, BATCH):
            texts = split.texts[low:min(low + BATCH, end)]
            writer.add(np.arange(low - start, low - start + len(texts)), np.array([key_hi(t) for t in texts], dtype=np.uint64),
                       batch_bands(*batch(texts), settings))
        writer.close()
        sources.append((tmp / f"{ordinal}.bands", ordinal))
    similar = jaccard_filter(split.texts_of, split.sizes_of, settings.ngram, settings.threshold) if verify else None
    for bucket in range(1 << bits):
        write_pairs(tmp / f"{bucket}.pairs", bucket_pairs(gather_bands(sources, bucket, bits), similar), {"bucket": bucket})
    path = local_drops([tmp / f"{bucket}.pairs" for bucket in range(1 << bits)], tmp / "rounds", range_bits)
    drops = open_drops(path).read_all()
    found = np.array([(split.position(int(d)), split.position(int(r)))
                      for d, r in zip(drops["document"], drops["representative"])], dtype=np.int64).reshape(-1, 2)
    return found, path.read_bytes()


def planted(rng: random.Random) -> list[str]:
    """120 originals, each with 1 to 3 copies edited at 0 to 4% or 4 to 12% of words (one exact
    copy now and then), and 300 unrelated documents, shuffled."""
    texts = [" ".join(document(rng, rng.randint(30, 200))) for _ in range(300)]
    for _ in range(120):
        words = document(rng, rng.randint(80, 300))
        texts.append(" ".join(words))
        for _ in range(rng.randint(1, 3)):
            rate = rng.choice([0.0, rng.uniform(0, 0.04), rng.uniform(0.04, 0.12)])
            texts.append(" ".join(edited(rng, words, rate)))
    rng.shuffle(texts)
    return texts


def representatives(count: int, drops: Array) -> Array:
    """Each corpus position's kept document: its representative if dropped, else itself."""
    kept = np.arange(count)
    kept[drops[:, 0]] = drops[:, 1]
    return kept


def sharing(sets: list[Array]) -> set[tuple[int, int]]:
    """Every pair of documents with a shingle in common (the only ones whose Jaccard is not 0)."""
    holders: dict[int, list[int]] = {}
    for position, shingles in enumerate(sets):
        for shingle in shingles.tolist():
            holders.setdefault(shingle, []).append(position)
    return {(a, b) for group in holders.values() for a in group for b in group if a < b}


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], list[Array]]:
    texts = planted(random.Random(7))
    return texts, shingle_sets(*batch(texts), SETTINGS.ngram)


def test_planted_near_duplicates_are_found(corpus: tuple[list[str], list[Array]], tmp_path: Path) -> None:
    texts, sets = corpus
    drops, _ = run(Split(texts, (200, 500)), tmp_path / "run", bits=2, verify=False)
    kept = representatives(len(texts), drops)
    similar = [(a, b) for a, b in sharing(sets) if jaccard(sets[a], sets[b]) >= 0.9]
    assert len(similar) >= 100
    assert sum(kept[a] == kept[b] for a, b in similar) / len(similar) >= 0.95
    assert bool((drops[:, 1] < drops[:, 0]).all())  # the first in input order is kept
    assert set(drops[:, 1].tolist()).isdisjoint(drops[:, 0].tolist())


def test_verified_clusters_join_no_dissimilar_documents(corpus: tuple[list[str], list[Array]], tmp_path: Path) -> None:
    texts, sets = corpus
    drops, _ = run(Split(texts, (333, 334)), tmp_path / "run", bits=3, verify=True)
    kept = representatives(len(texts), drops)
    assert len(drops) >= 100
    for cluster in {int(r) for r in drops[:, 1]}:
        members = np.flatnonzero(kept == cluster).tolist()
        assert all(jaccard(sets[a], sets[b]) >= 0.5 for a in members for b in members if a < b)


def test_the_same_drops_whatever_the_buckets_and_the_parts(corpus: tuple[list[str], list[Array]], tmp_path: Path) -> None:
    texts, _ = corpus
    for verify in (False, True):
        runs = {(bits, cuts): run(Split(texts, cuts), tmp_path / f"{verify}-{bits}-{len(cuts)}-{cuts[:1]}", bits, verify)
                for bits in (0, 1, 4) for cuts in ((), (150, 151, 600), (400,))}
        reference = runs[0, ()][0]
        assert len(reference) >= 100
        for (bits, cuts), (drops, data) in runs.items():
            assert np.array_equal(drops[np.lexsort(drops.T[::-1])], reference[np.lexsort(reference.T[::-1])]), (bits, cuts)
            assert data == runs[0, cuts][1]  # one split: the same drops object whatever the buckets


def test_a_chain_ends_in_one_cluster_under_its_first_document(tmp_path: Path) -> None:
    words = document(random.Random(3), 120)
    chain = [" ".join(words[0:100]), " ".join(words[10:110]), " ".join(words[20:120])]  # A~B, B~C (0.81), A!~C (0.66)
    others = [" ".join(document(random.Random(seed), 100)) for seed in range(10, 15)]
    texts = [others[0], chain[0], others[1], chain[1], others[2], others[3], chain[2], others[4]]
    sets = shingle_sets(*batch(texts), SETTINGS.ngram)
    assert jaccard(sets[1], sets[3]) >= 0.8 > jaccard(sets[1], sets[6])
    wide = NearDupSettings(threshold=0.8, bands=32, rows=4)
    for cuts in ((), (2,), (3, 5)):
        for bits in (0, 1, 4):
            drops, _ = run(Split(texts, cuts), tmp_path / f"{cuts}-{bits}", bits, verify=True, settings=wide)
            assert sorted(map(tuple, drops.tolist())) == [(3, 1), (6, 1)]


def test_verify_pairs_rejected_members_among_themselves() -> None:
    records = np.zeros(4, dtype=[("hash", "<u8"), ("key_hi", "<u8"), ("row", "<u4")])
    records["hash"], records["row"], records["key_hi"] = 5, [0, 1, 2, 3], [9, 8, 7, 6]
    pairs = bucket_pairs([(0, records)], lambda left, right: (left != 0) | (right == 1))  # 0 is like 1 only
    assert list(zip(pairs.left.tolist(), pairs.right.tolist())) == [(0, 1), (2, 3)]
    assert (pairs.documents.tolist(), pairs.key_hi.tolist()) == ([0, 1, 2, 3], [9, 8, 7, 6])


def _entries(parts: Sequence[int], rows: Sequence[int], keys: Sequence[int]) -> Array:
    entries = np.zeros(len(parts), dtype=ENTRY_DTYPE)
    entries["part"], entries["row"], entries["key_hi"] = parts, rows, keys
    entries["key_lo"] = entries["key_hi"]
    return entries


def test_the_order_filter_drops_its_buckets_drops_after_exact_dedup() -> None:
    # an original (0,0), its exact copy (1,4), a near duplicate (2,1) of it, another document (1,0)
    gathered = _entries([1, 0, 2, 1], [4, 0, 1, 0], [10, 10, 30, 20])
    kept, exact = sort_and_dedup(gathered, exact=True)
    numbers = global_numbers(gathered["part"], gathered["row"])
    drops = drop_records(global_numbers(np.array([1, 2]), np.array([4, 1])), np.zeros(2, dtype=np.int64),
                         np.array([10, 30], dtype=np.uint64))
    left, near = drop_near_duplicates(kept, drops, numbers)
    assert (exact, near) == (1, 1)
    assert list(zip(left["part"].tolist(), left["row"].tolist())) == [(0, 0), (1, 0)]
    assert drop_near_duplicates(kept, np.zeros(0, dtype=DROP_DTYPE), numbers)[1] == 0


def test_the_order_filter_refuses_drops_that_do_not_name_its_documents() -> None:
    gathered = _entries([0, 1], [0, 0], [10, 20])
    numbers = global_numbers(gathered["part"], gathered["row"])
    stranger = drop_records(np.array([5 << 32]), np.array([0]), np.array([10], dtype=np.uint64))
    with pytest.raises(IntegrityError, match="never gathered"):
        drop_near_duplicates(gathered, stranger, numbers)
    wrong_key = drop_records(np.array([1 << 32]), np.array([0]), np.array([99], dtype=np.uint64))
    with pytest.raises(IntegrityError, match="order key"):
        drop_near_duplicates(gathered, wrong_key, numbers)


@pytest.mark.parametrize("range_bits", [1, 3, 6])
def test_clusters_joined_over_any_number_of_ranges_are_the_same_drops_object(
        corpus: tuple[list[str], list[Array]], tmp_path: Path, range_bits: int) -> None:
    texts, _ = corpus
    whole = run(Split(texts, (300,)), tmp_path / "whole", bits=4, verify=False)[1]
    assert run(Split(texts, (300,)), tmp_path / "ranges", bits=4, verify=False, range_bits=range_bits)[1] == whole


WORDS = st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=24).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=12), st.data(), st.integers(1, 700))
def test_verify_in_slices_of_a_tiny_budget_accepts_the_same_pairs(texts: list[str], data: st.DataObject,
                                                                 budget: int) -> None:
    split = Split(texts, ())
    index = st.integers(0, len(texts) - 1)
    pairs = np.array(data.draw(st.lists(st.tuples(index, index), max_size=40)), dtype=np.int64).reshape(-1, 2)
    similar = jaccard_filter(split.texts_of, split.sizes_of, 2, 0.5)
    whole = similar(pairs[:, 0], pairs[:, 1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(neardedup, "VERIFY_BYTES", budget)
        assert np.array_equal(similar(pairs[:, 0], pairs[:, 1]), whole)
    assert whole.dtype == bool and len(whole) == len(pairs)


def test_verify_computes_a_pair_that_comes_once_a_band_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round names the same pair once for each band of the bucket it shares: each distinct pair is
    computed once and its verdict given to every copy, in the round's order."""
    rng = random.Random(3)
    words = document(rng, 200)
    texts = [" ".join(words), " ".join(edited(rng, words, 0.01)), " ".join(document(rng, 200)), " ".join(words)]
    computed: list[int] = []
    real = lsh.pair_jaccards

    def counting(*args: Any) -> Array:
        computed.append(len(args[3]))
        return real(*args)

    monkeypatch.setattr(neardedup, "pair_jaccards", counting)
    split = Split(texts, ())
    left, right = np.array([0, 0, 2, 0, 1, 0, 2, 0]), np.array([1, 1, 3, 2, 3, 1, 3, 3])
    verdicts = jaccard_filter(split.texts_of, split.sizes_of, 5, 0.8)(left, right)
    assert computed == [5]
    assert verdicts.tolist() == [True, True, False, False, True, True, False, True]


def test_verify_holds_a_budget_of_text_at_once_whatever_a_bucket_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """One band bucket of 200 documents (near copies, unrelated ones and two larger than the
    budget) naming about 40 times the budget of text: each read holds at most the budget, or a
    pair over it alone (one naming a larger document), and the pairs are those of one read per round."""
    rng = random.Random(5)
    originals = [document(rng, 300) for _ in range(10)]
    texts = [" ".join(edited(rng, rng.choice(originals), rng.uniform(0, 0.03)) if rng.random() < 0.8
                      else document(rng, rng.randint(100, 400))) for _ in range(198)]
    budget = 2 * max(map(len, texts))
    texts[7:7] = [" ".join(document(rng, 1500))] * 2  # a pair over the budget, alone in its slice
    split = Split(texts, ())
    records = np.zeros(len(texts), dtype=BAND_DTYPE)
    records["hash"], records["row"], records["key_hi"] = 5, np.arange(len(texts)), rng.getrandbits(64)
    reads: list[tuple[int, int]] = []

    def texts_of(numbers: Array) -> list[bytes]:
        read = split.texts_of(numbers)
        reads.append((len(read), sum(map(len, read))))
        return read

    def pairs_of(limit: int) -> tuple[Array, ...]:
        reads.clear()
        monkeypatch.setattr(neardedup, "VERIFY_BYTES", limit)
        pairs = bucket_pairs([(0, records)], jaccard_filter(texts_of, split.sizes_of, SETTINGS.ngram, SETTINGS.threshold))
        return pairs.left, pairs.right, pairs.documents, pairs.key_hi

    whole = pairs_of(1 << 40)
    rounds = len(reads)
    assert rounds >= 3 and max(held for _, held in reads) >= 30 * budget
    sliced = pairs_of(budget)
    large = len(texts[7])
    assert all(held <= budget or (documents <= 2 and held >= large) for documents, held in reads)
    assert (2, 2 * large) in reads and max(held for _, held in reads) < sum(map(len, texts)) / 10
    assert len(reads) >= 2 * rounds
    assert all(np.array_equal(a, b) for a, b in zip(sliced, whole)) and len(whole[0]) >= 50


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=30),
       st.lists(st.integers(0, 50), min_size=10, max_size=10), st.integers(0, 120))
def test_budget_slices_cover_the_pairs_in_order_within_the_budget(pairs: list[tuple[int, int]], sizes: list[int],
                                                                  budget: int) -> None:
    at = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    slices = list(budget_slices(at[:, 0], at[:, 1], np.array(sizes), budget))
    bounds = [0, *(high for _, high in slices)]
    assert [low for low, _ in slices] == bounds[:-1] and bounds[-1] == len(pairs)
    for low, high in slices:
        held = sum(sizes[document] for document in set(at[low:high].ravel().tolist()))
        assert high > low and (held <= budget or high - low == 1)
