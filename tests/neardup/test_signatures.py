"""MinHash signatures: the documented definitions (a scalar reference), batch independence,
normalization, short and empty documents, accuracy against true Jaccard, golden values; each by
numpy and by the compiled kernels (prep.neardup.kernel), whichever a batch would choose."""

from __future__ import annotations

import hashlib
import random
import unicodedata
from collections.abc import Iterator
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import prep.neardup.signatures as signatures_module
from prep.neardup import kernel, normalization
from prep.neardup.lsh import estimated_similarity, jaccard
from prep.neardup.settings import NearDupSettings
from prep.neardup.signatures import WHITESPACE, WIDE_WHITESPACE, hash_family, shingle_sets, signatures
from tests.neardup.neardupsupport import batch, document, edited, signatures_of, true_jaccard

MASK = 2**64 - 1
G = 0x9E3779B97F4A7C15
SMALL = NearDupSettings(ngram=3, permutations=16, bands=4, rows=4, seed=11)


@pytest.fixture(autouse=True, scope="module", params=["numpy", "compiled"])
def signing_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here once with numpy's whole-array passes and once with the compiled kernels."""
    if request.param == "compiled" and kernel.compiled() is None:
        pytest.skip("numba is not installed (the `fast` extra)")
    normalization.case_table()  # built once a process, before any test's deadline runs
    with patch.object(kernel, "chosen", lambda products: kernel.compiled() if request.param == "compiled" else None):
        yield request.param


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _word_hash(word: bytes) -> int:
    lanes = [int.from_bytes(word[i:i + 8], "little") for i in range(0, len(word), 8)]
    total = sum(_mix64(lane ^ ((k + 1) * G & MASK)) for k, lane in enumerate(lanes)) & MASK
    return _mix64(total ^ len(word))


def _reference(text: str, ngram: int, permutations: int, seed: int) -> list[int]:
    """docs/build.md's definitions, one document, in plain Python integers."""
    words = [word.encode("utf-8") for word in unicodedata.normalize("NFC", text).lower().split()]
    hashes = [_word_hash(word) for word in words]
    runs = [hashes[i:i + ngram] for i in range(len(hashes) - ngram + 1)] if len(hashes) >= ngram else \
        [hashes] if hashes else []
    shingles = []
    for run in runs:
        value = len(run)
        for word in run:
            value = (value * G + word) & MASK
        shingles.append(_mix64(value))
    family = hash_family(seed, permutations)
    return [min(((int(a) * x) & MASK) >> 32 for x in shingles) if shingles else 0xFFFFFFFF
            for a in family.multipliers]


PIECES = list("abcÉéü ñ.,-\t\n") + ["\u3000", "\xa0", "\u2029", "\x1c", "日本", "e\u0301", "x" * 9, "y" * 17, "Ω", "İ"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=30).map("".join) | st.text(max_size=30)


@given(st.lists(TEXT, max_size=6), st.integers(1, 4))
def test_signatures_follow_the_documented_definitions(texts: list[str], ngram: int) -> None:
    got = signatures_of(texts, NearDupSettings(ngram=ngram, permutations=8, bands=2, rows=4, seed=3))
    assert got.shape == (len(texts), 8) and got.dtype == np.uint32
    assert [row.tolist() for row in got] == [_reference(text, ngram, 8, 3) for text in texts]


@given(st.lists(st.text(max_size=40), min_size=1, max_size=8), st.data())
def test_a_signature_does_not_depend_on_the_batch(texts: list[str], data: st.DataObject) -> None:
    whole = signatures_of(texts, SMALL)
    cut = sorted(data.draw(st.lists(st.integers(0, len(texts)), max_size=3)))
    bounds = [0, *cut, len(texts)]
    parts = [signatures_of(texts[start:end], SMALL) for start, end in zip(bounds[:-1], bounds[1:])]
    assert np.array_equal(np.concatenate(parts), whole)


def test_normalization_gives_equal_signatures() -> None:
    plain = "the café in Malmö served crème brûlée to Åsa and Ñandú"
    variants = [
        unicodedata.normalize("NFD", plain),
        plain.upper(),
        "  the\tcafé in\n\nMalmö\u3000served  crème\xa0brûlée to Åsa and\u2028Ñandú \n",
        plain.replace("Å", "\u212b"),  # the Angstrom sign, whose NFC is Å
    ]
    assert np.unique(signatures_of([plain, *variants]), axis=0).shape[0] == 1
    assert not np.array_equal(*signatures_of([plain, plain.replace("café", "cafe")]))
    assert not np.array_equal(*signatures_of([plain, plain.replace("café", "café.")]))  # punctuation stays


def test_whitespace_is_what_str_split_splits_on() -> None:
    assert sorted(WHITESPACE) == sorted(chr(c) for c in range(0x110000) if chr(c).isspace())
    # what `words` relies on: ASCII whitespace is 9-13 and 28-32, the others start with these bytes
    assert sorted(ord(char) for char in WHITESPACE if char.isascii()) == [*range(9, 14), *range(28, 33)]
    assert set(WIDE_WHITESPACE) == {0xC2, 0xE1, 0xE2, 0xE3}


def test_short_and_empty_documents() -> None:
    sig = signatures_of(["", " \t\u3000\n", "one", "one two", "ONE  two", "one two three four five", "two one"])
    assert (sig[0] == 0xFFFFFFFF).all() and np.array_equal(sig[0], sig[1])
    assert np.array_equal(sig[3], sig[4])
    assert len({row.tobytes() for row in sig[2:]}) == 4  # one word, two, five and reordered all differ
    assert estimated_similarity(sig[0], sig[1]) == 1.0 and estimated_similarity(sig[0], sig[2]) == 0.0


def test_non_ascii_documents_in_an_ascii_batch() -> None:
    texts = ["plain ascii words here and there", "日本語\u3000の\u3000テキスト です", "Ελληνικά κείμενα ΣΟΦΟΣ", "ascii again"]
    together = signatures_of(texts)
    alone = np.concatenate([signatures_of([text]) for text in texts])
    assert np.array_equal(together, alone)
    assert np.array_equal(signatures_of(["日本語 の テキスト です"])[0], together[1])


def test_estimated_jaccard_tracks_true_jaccard() -> None:
    rng = random.Random(5)
    errors, true_values = [], []
    for _ in range(300):
        words = document(rng, rng.randint(100, 400))
        other = edited(rng, words, rng.uniform(0, 0.15))
        texts = [" ".join(words), " ".join(other)]
        blob, offsets = batch(texts)
        a, b = shingle_sets(blob, offsets, 5)
        truth = jaccard(a, b)
        assert abs(truth - true_jaccard(words, other)) < 1e-9
        sig = signatures_of(texts)
        errors.append(estimated_similarity(sig[0], sig[1]) - truth)
        true_values.append(truth)
    assert min(true_values) < 0.4 and max(true_values) > 0.95
    assert float(np.mean(np.abs(errors))) < 0.035  # sqrt(J(1-J)/128) is at most 0.044
    assert abs(float(np.mean(errors))) < 0.01  # no bias


def test_the_hash_family_is_fixed_by_its_seed() -> None:
    family = hash_family(0, 4)
    assert [int(a) for a in family.multipliers] == [a | 1 for a in _raw_pcg64(0, 4)]
    assert (family.multipliers & np.uint64(1)).all()
    assert not np.array_equal(hash_family(1, 4).multipliers, family.multipliers)


def _raw_pcg64(seed: int, count: int) -> list[int]:
    return [int(value) for value in np.random.PCG64(seed).random_raw(count)]


GOLDEN_TEXTS = ["The quick brown fox jumps over the lazy dog near the river bank.", "", "two words",
                "Ünïcödé  TEXT\twith\u3000wide spaces and a café", "x" * 100 + " " + "y" * 3]


def test_golden_signatures() -> None:
    """Fixed outputs: a change here changes every near-dup snapshot id (docs/build.md)."""
    sig = signatures_of(GOLDEN_TEXTS)
    assert sig[0, :4].tolist() == GOLDEN_FIRST
    assert hashlib.sha256(sig.astype("<u4").tobytes()).hexdigest() == GOLDEN_SHA256
    assert signatures(*batch(GOLDEN_TEXTS[:1]), 5, 128, 0)[0, :4].tolist() == GOLDEN_FIRST


GOLDEN_FIRST = [289697961, 305030736, 457232828, 1228067570]
GOLDEN_SHA256 = "dc5966a13f71de9368faa84fe36ffcc0ed8b4946eebc8a157fc8d76201b6e8f2"


def test_slices_of_a_batch_give_the_same_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [" ".join(f"w{i * j % 97}" for i in range(j * 3)) for j in range(40)] + ["", "last one"]
    whole = signatures_of(texts)
    monkeypatch.setattr(signatures_module, "SLICE_BYTES", 50)
    assert np.array_equal(signatures_of(texts), whole)


@given(st.lists(st.lists(st.sampled_from(["ab", "c", "x" * 20, "é", "日本", "\u3000", " ", "\n"]), max_size=60).map("".join),
                max_size=4), st.integers(1, 6))
def test_a_document_larger_than_a_slice_goes_in_pieces_with_the_same_signature(texts: list[str], ngram: int) -> None:
    settings = NearDupSettings(ngram=ngram, permutations=8, bands=2, rows=4, seed=5)
    whole = signatures_of(texts, settings)
    with patch.object(signatures_module, "SLICE_BYTES", 7):
        assert np.array_equal(signatures_of(texts, settings), whole)
