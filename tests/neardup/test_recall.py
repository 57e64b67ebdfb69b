"""Recall and precision of the whole compute path with default settings (16 x 8, `verify`), on
planted near duplicates: signatures, band hashes, candidate pairs, `verify`'s exact Jaccard, clusters."""

from __future__ import annotations

import random

import numpy as np

from prep.neardup.lsh import band_hashes, candidate_pairs, jaccard
from prep.neardup.signatures import shingle_sets
from tests.neardup.neardupsupport import DEFAULTS, batch, document, edited, signatures_of
from tests.neardup.unionfind import clusters


def _corpus(rng: random.Random) -> tuple[list[str], list[tuple[int, int]]]:
    """Originals, each followed somewhere later by a copy with words edited at a rate drawn from
    0 to 12% (true Jaccard about 0.55 to 1), among unrelated documents; and the planted pairs."""
    texts: list[str] = []
    planted = []
    for _ in range(1200):
        words = document(rng, rng.randint(150, 500))
        texts.append(" ".join(words))
        texts.append(" ".join(document(rng, rng.randint(20, 300))))  # unrelated
        texts.append(" ".join(edited(rng, words, rng.choice([rng.uniform(0, 0.011), rng.uniform(0.011, 0.12)]))))
        planted.append((len(texts) - 3, len(texts) - 1))
    return texts, planted


def test_planted_near_duplicates_are_found_and_verify_keeps_only_true_ones() -> None:
    texts, planted = _corpus(random.Random(42))
    sig = signatures_of(texts)
    hashes = band_hashes(sig, DEFAULTS.bands, DEFAULTS.rows)
    sets = shingle_sets(*batch(texts), DEFAULTS.ngram)
    truth = {pair: jaccard(sets[pair[0]], sets[pair[1]]) for pair in planted}
    high = [pair for pair, value in truth.items() if value >= DEFAULTS.threshold]
    collided = [pair for pair in high if (hashes[pair[0]] == hashes[pair[1]]).any()]
    assert len(high) >= 600 and sum(truth[pair] < 0.85 for pair in high) >= 40
    # Every one here (16 x 8); the 8 x 16 banding that was the default before verify was found
    # 0.86 of them, 0.30 of those below 0.85.
    assert len(collided) / len(high) >= 0.95
    _band_collisions_follow_the_s_curve(truth, {pair: (hashes[pair[0]] == hashes[pair[1]]).any() for pair in planted})

    left, right = candidate_pairs(hashes, np.arange(len(texts), dtype=np.int64))
    similar = np.array([jaccard(sets[a], sets[b]) >= DEFAULTS.threshold for a, b in zip(left, right)], dtype=bool)
    verified = clusters(left[similar], right[similar])
    for document_number, representative in zip(verified.documents.tolist(), verified.representatives.tolist()):
        assert jaccard(sets[document_number], sets[representative]) >= 0.5
    kept_pairs = set(zip(verified.representatives.tolist(), verified.documents.tolist()))
    assert {pair for pair in collided if truth[pair] >= DEFAULTS.threshold} <= kept_pairs


def _band_collisions_follow_the_s_curve(truth: dict[tuple[int, int], float], collided: dict[tuple[int, int], bool]) -> None:
    """In each Jaccard range, the share of pairs sharing a band is within 4 standard errors of
    1 - (1 - s^rows)^bands averaged over the range's pairs: the permutations act independently
    (permutations that moved together would share whole bands far more often than that)."""
    for low, high in ((0.0, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 1.01)):
        pairs = [pair for pair, value in truth.items() if low <= value < high]
        chances = np.array([1 - (1 - truth[pair] ** DEFAULTS.rows) ** DEFAULTS.bands for pair in pairs])
        observed = np.mean([collided[pair] for pair in pairs])
        error = np.sqrt(np.sum(chances * (1 - chances))) / len(pairs)  # of the observed share, were bands independent
        assert len(pairs) >= 100 and abs(observed - chances.mean()) < 4 * error + 0.01, (low, high, observed, chances)
