"""Recall and precision of the whole compute path on planted near duplicates, with the default
settings (8 x 16) and with `verify` (16 x 8 derived): signatures, band hashes, candidate pairs,
`verify`'s exact Jaccard, clusters."""

from __future__ import annotations

import random

import numpy as np
import pytest

from prep.neardup.lsh import band_hashes, candidate_pairs, jaccard
from prep.neardup.settings import NearDupSettings, parse_settings
from prep.neardup.signatures import shingle_sets
from tests.neardup.neardupsupport import DEFAULTS, batch, document, edited, signatures_of
from tests.neardup.unionfind import clusters

VERIFIED = parse_settings({"verify": True})


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


@pytest.mark.parametrize(("settings", "found_from"), [(DEFAULTS, 0.9), (VERIFIED, VERIFIED.threshold)],
                         ids=["defaults", "verify"])
def test_planted_near_duplicates_are_found_and_verify_keeps_only_true_ones(settings: NearDupSettings,
                                                                           found_from: float) -> None:
    """95% of the pairs from `found_from` share a band: from 0.9 with the defaults (about 0.97
    here; 0.87 for pairs at 0.9 to 0.925 alone), from the threshold with `verify`'s banding (every
    one here; the defaults find 0.86 of them, 0.30 of those below 0.85)."""
    texts, planted = _corpus(random.Random(42))
    sig = signatures_of(texts)
    hashes = band_hashes(sig, settings.bands, settings.rows)
    sets = shingle_sets(*batch(texts), settings.ngram)
    truth = {pair: jaccard(sets[pair[0]], sets[pair[1]]) for pair in planted}
    high = [pair for pair, value in truth.items() if value >= found_from]
    collided = [pair for pair in high if (hashes[pair[0]] == hashes[pair[1]]).any()]
    assert len(high) >= 400 and (found_from >= 0.9 or sum(truth[pair] < 0.85 for pair in high) >= 40)
    assert len(collided) / len(high) >= 0.95
    collisions = {pair: bool((hashes[pair[0]] == hashes[pair[1]]).any()) for pair in planted}
    _band_collisions_follow_the_s_curve(truth, collisions, settings)

    left, right = candidate_pairs(hashes, np.arange(len(texts), dtype=np.int64))
    similar = np.array([jaccard(sets[a], sets[b]) >= settings.threshold for a, b in zip(left, right)], dtype=bool)
    verified = clusters(left[similar], right[similar])
    for document_number, representative in zip(verified.documents.tolist(), verified.representatives.tolist()):
        assert jaccard(sets[document_number], sets[representative]) >= 0.5
    kept_pairs = set(zip(verified.representatives.tolist(), verified.documents.tolist()))
    assert {pair for pair in collided if truth[pair] >= settings.threshold} <= kept_pairs


def _band_collisions_follow_the_s_curve(truth: dict[tuple[int, int], float], collided: dict[tuple[int, int], bool],
                                        settings: NearDupSettings) -> None:
    """In each Jaccard range, the share of pairs sharing a band is within 4 standard errors of
    1 - (1 - s^rows)^bands averaged over the range's pairs: the permutations act independently
    (permutations that moved together would share whole bands far more often than that)."""
    for low, high in ((0.0, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 1.01)):
        pairs = [pair for pair, value in truth.items() if low <= value < high]
        chances = np.array([1 - (1 - truth[pair] ** settings.rows) ** settings.bands for pair in pairs])
        observed = np.mean([collided[pair] for pair in pairs])
        error = np.sqrt(np.sum(chances * (1 - chances))) / len(pairs)  # of the observed share, were bands independent
        assert len(pairs) >= 100 and abs(observed - chances.mean()) < 4 * error + 0.01, (low, high, observed, chances)
