"""The compiled kernels: the same integers as numpy for any shingles and document bounds, and
for any text (every whitespace character and its neighbours, words across 8-byte lanes, documents
of more shingles than a scratch holds), used from a batch's size on or once loaded, and never a
difference in a signature."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import prep
from prep.neardup import kernel
from prep.neardup.kernel import Array
from prep.neardup.lsh import pair_jaccards
from prep.neardup.signatures import WHITESPACE, hash_family, minhash, numpy_minhash, packed, shingle_hashes, signatures
from tests.neardup.neardupsupport import batch, document
from tests.runner.test_disk_full import fill_up, read_only_view, small_tmpfs

pytestmark = pytest.mark.skipif(kernel.compiled() is None, reason="numba is not installed (the `fast` extra)")

EDGES = st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1])


@given(st.lists(st.lists(st.integers(0, 2**64 - 1) | EDGES, max_size=12), max_size=8), st.integers(1, 40),
       st.integers(0, 2**32))
def test_the_kernel_computes_what_numpy_computes(documents: list[list[int]], permutations: int, seed: int) -> None:
    hashes = np.array([value for shingles in documents for value in shingles], dtype=np.uint64)
    bounds = np.concatenate([[0], np.cumsum([len(shingles) for shingles in documents])]).astype(np.int64)
    family = hash_family(seed, permutations)
    compiled = kernel.compiled()
    assert compiled is not None
    lows = np.empty((len(documents), permutations), dtype=np.uint64)
    compiled.minima(hashes, bounds, family.multipliers, lows)
    assert np.array_equal((lows >> np.uint64(32)).astype(np.uint32), numpy_minhash(hashes, bounds, family))


def _texts(count: int) -> list[str]:
    rng = random.Random(7)
    return [" ".join(document(rng, rng.randrange(0, 400))) for _ in range(count)] + [""]


def by_both(texts: list[bytes], ngram: int, permutations: int = 16, seed: int = 3) -> tuple[Array, Array]:
    """The signatures of `texts` in one batch by numpy and by the compiled kernels."""
    blob, offsets = packed(texts)
    with patch.object(kernel, "chosen", lambda products: None):
        by_numpy = signatures(blob, offsets, ngram, permutations, seed)
    with patch.object(kernel, "chosen", lambda products: kernel.compiled()):
        by_kernel = signatures(blob, offsets, ngram, permutations, seed)
    return by_numpy, by_kernel


def test_signatures_are_the_same_with_the_kernel_or_without(monkeypatch: pytest.MonkeyPatch) -> None:
    blob, offsets = batch(_texts(300))
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", 2**62)
    monkeypatch.setattr(kernel, "loaded", lambda: False)
    by_numpy = signatures(blob, offsets, 5, 128, 3)
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", 0)
    by_kernel = signatures(blob, offsets, 5, 128, 3)
    assert np.array_equal(by_numpy, by_kernel)
    assert (by_kernel == 0xFFFFFFFF).all(axis=1).any()  # an empty document is in the batch


NEIGHBOURS = [chr(code) for code in (0x80, 0x84, 0x86, 0x9F, 0xA1, 0x1679, 0x1681, 0x180E, 0x1FFF, 0x200B,
                                     0x2027, 0x202A, 0x202E, 0x2030, 0x205E, 0x2060, 0x2FFF, 0x3001, 0xFEFF)]
"""Characters whose UTF-8 shares a lead byte (and often a second) with a whitespace character's."""
PIECES = [*WHITESPACE, *NEIGHBOURS, "a", "Bc", "x" * 7, "y" * 8, "z" * 9, "w" * 16, "v" * 17, "é" * 4, "日本", "e\u0301",
          "İ", "Σ", ".", "\x00"]


@settings(deadline=None)  # the first example may load the kernels
@given(st.lists(st.lists(st.sampled_from(PIECES), max_size=40).map("".join) | st.text(max_size=40), max_size=6),
       st.integers(1, 6))
def test_the_compiled_text_pass_signs_what_numpy_signs(texts: list[str], ngram: int) -> None:
    by_numpy, by_kernel = by_both([text.encode("utf-8") for text in texts], ngram)
    assert np.array_equal(by_numpy, by_kernel)


def test_every_character_up_to_u3100_separates_words_in_the_compiled_pass_exactly_when_it_is_whitespace() -> None:
    """One document a character, between two words: split (the signature of "a b") exactly when
    str.split splits, and by both paths alike."""
    codes = [code for code in range(0x3100) if not 0xD800 <= code < 0xE000]
    by_numpy, by_kernel = by_both([f"a{chr(code)}b".encode() for code in codes], ngram=1, permutations=4)
    assert np.array_equal(by_numpy, by_kernel)
    split = by_both([b"a b"], ngram=1, permutations=4)[1][0]
    assert [code for code, row in zip(codes, by_kernel) if np.array_equal(row, split)] == \
        sorted(ord(char) for char in WHITESPACE if ord(char) < 0x3100)


def test_words_and_wide_whitespace_across_the_compiled_pass_s_64_byte_steps_sign_as_numpy_does() -> None:
    """A word, then a wide whitespace character or an ASCII space, at every offset across the first
    two 64-byte steps, and the word after it ending there too."""
    texts = [("x" * offset + space + "y" * tail + " z").encode() for offset in range(0, 140)
             for space in (" ", "\u3000", "\u2029", "\xa0") for tail in (0, 1, 63, 64, 65)]
    by_numpy, by_kernel = by_both(texts, ngram=2, permutations=8)
    assert np.array_equal(by_numpy, by_kernel)


def test_a_document_of_more_shingles_than_the_scratch_holds_signs_as_numpy_does() -> None:
    rng = random.Random(3)
    words = document(rng, 3 * 4096 + 7)
    texts = [" ".join(words).encode(), " ".join(words[:4096 + 4]).encode(), "\u3000".join(words[:9000]).encode()]
    by_numpy, by_kernel = by_both(texts, ngram=5, permutations=128)
    assert np.array_equal(by_numpy, by_kernel)


def test_a_small_batch_stays_on_numpy_until_the_kernel_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = kernel.compiled()
    assert real is not None

    def counting(*args: Array) -> None:
        calls.append(len(args[0]))
        real.minima(*args)

    hashes, bounds = shingle_hashes(*batch(_texts(20)), 5)
    family = hash_family(0, 16)
    monkeypatch.setattr(kernel, "compiled", lambda: dataclasses.replace(real, minima=counting))
    monkeypatch.setattr(kernel, "loaded", lambda: False)
    small = minhash(hashes, bounds, family)
    assert calls == []
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", len(hashes) * 16)
    assert np.array_equal(minhash(hashes, bounds, family), small)
    assert calls == [len(hashes)]
    monkeypatch.setattr(kernel, "KERNEL_PRODUCTS", 2**62)
    monkeypatch.setattr(kernel, "loaded", lambda: True)
    assert np.array_equal(minhash(hashes, bounds, family), small)
    assert calls == [len(hashes)] * 2


def test_verify_loads_the_kernels_for_a_batch_that_repays_it_or_once_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "loaded", lambda: False)
    assert kernel.chosen_for_text(kernel.KERNEL_TEXT_BYTES - 1) is None
    assert kernel.chosen_for_text(kernel.KERNEL_TEXT_BYTES) is kernel.compiled() is not None
    monkeypatch.setattr(kernel, "loaded", lambda: True)
    assert kernel.chosen_for_text(0) is kernel.compiled()


@pytest.mark.parametrize("accents", [0, 1000], ids=["ascii", "an accent every 1000 words"])
def test_the_compiled_pass_holds_no_array_the_size_of_a_document_but_its_text(accents: int) -> None:
    """A document of 6 MB signed in one piece: its copy and its normalized copy, padded (2x its
    size; with stretches Python normalizes, the copy goes before the normalized one is spliced);
    numpy's passes take about 7x (their word and shingle arrays, in pieces of SLICE_BYTES)."""
    rng = random.Random(1)
    words = document(rng, 1_000_000)
    for index in range(0, len(words), accents or len(words) + 1):
        words[index] = "e\u0301" + words[index]
    blob, offsets = packed([" ".join(words).encode()])
    with patch.object(kernel, "chosen", lambda products: kernel.compiled()):
        signatures(blob[:100], np.array([0, 100]), 5, 128, 0)  # loaded before measuring
        tracemalloc.start()
        try:
            signatures(blob, offsets, 5, 128, 0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 2.2 * len(blob), (peak, len(blob))


def jaccards_by_both(texts: list[bytes], ngram: int, pairs: list[tuple[int, int]]) -> tuple[Array, Array]:
    """`verify`'s exact Jaccards of `pairs` of `texts` in one batch, by numpy and by the compiled pass."""
    blob, offsets = packed(texts)
    left, right = (np.array([pair[side] for pair in pairs], dtype=np.int64) for side in (0, 1))
    with patch.object(kernel, "chosen_for_text", lambda size: None):
        by_numpy = pair_jaccards(blob, offsets, ngram, left, right)
    with patch.object(kernel, "chosen_for_text", lambda size: kernel.compiled()):
        by_kernel = pair_jaccards(blob, offsets, ngram, left, right)
    return by_numpy, by_kernel


@settings(deadline=None)
@given(st.lists(st.lists(st.sampled_from([*PIECES, " a", " a b", "b "]), max_size=40).map("".join) | st.text(max_size=40),
                min_size=1, max_size=6), st.integers(1, 6), st.data())
def test_the_compiled_pair_jaccards_are_the_exact_ones(texts: list[str], ngram: int, data: st.DataObject) -> None:
    """Equal floats on both paths, for texts of repeated, composing, case-special and one-byte
    words (as many words as bytes allow), empty ones and a document paired with itself."""
    index = st.integers(0, len(texts) - 1)
    pairs = data.draw(st.lists(st.tuples(index, index), min_size=1, max_size=12))
    by_numpy, by_kernel = jaccards_by_both([text.encode("utf-8") for text in texts], ngram, pairs)
    assert np.array_equal(by_numpy, by_kernel)


def test_pair_jaccards_hold_every_shingle_of_the_densest_and_the_longest_documents() -> None:
    """One-byte words a space apart (the most words a byte count allows, what the compiled pass
    makes room for) and documents of more shingles than the signature pass's scratch."""
    rng = random.Random(5)
    words = document(rng, 3 * 4096 + 7)
    dense = " ".join(chr(ord("a") + rng.randrange(26)) for _ in range(5000))
    texts = [dense.encode(), dense[:-2].encode(), " ".join(words).encode(), " ".join(words[:9000]).encode(), b"a", b"",
             b" ", "\u3000".join(words[:5000]).encode()]
    pairs = [(0, 1), (1, 0), (2, 3), (3, 2), (4, 4), (5, 5), (5, 6), (4, 5), (7, 3), (0, 0)]
    by_numpy, by_kernel = jaccards_by_both(texts, 1, pairs)
    assert np.array_equal(by_numpy, by_kernel)
    by_numpy, by_kernel = jaccards_by_both(texts, 5, pairs)
    assert np.array_equal(by_numpy, by_kernel)
    assert by_kernel[4] == by_kernel[5] == 1.0 and 0.4 < by_kernel[2] < 1.0


READ_ONLY_CHECK = """
import numpy as np
import prep
from prep.neardup import native
from prep.neardup.signatures import hash_family, numpy_minhash
hashes, bounds = np.arange(1, 50, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15), np.array([0, 20, 49])
family = hash_family(0, 8)
lows = np.empty((2, 8), dtype=np.uint64)
native.minima(hashes, bounds, family.multipliers, lows)
print(prep.__file__, np.array_equal((lows >> np.uint64(32)).astype(np.uint32), numpy_minhash(hashes, bounds, family)))
"""


def test_a_read_only_install_with_no_writable_cache_folder_compiles_in_memory(tmp_path: Path) -> None:
    """prep on a read-only filesystem, its home and cache home read-only too (a locked-down
    container): numba refuses to cache, so the kernels compile in memory instead of failing the
    import (which raised RuntimeError through every near-dup build before)."""
    source = tmp_path / "source"
    shutil.copytree(Path(prep.__file__).parent, source / "prep", ignore=shutil.ignore_patterns("__pycache__"))
    with read_only_view(source, tmp_path / "read-only") as mount:
        environment = {**os.environ, "PYTHONPATH": str(mount), "HOME": str(mount), "XDG_CACHE_HOME": str(mount)}
        environment.pop("NUMBA_CACHE_DIR", None)
        done = subprocess.run([sys.executable, "-c", READ_ONLY_CHECK], env=environment, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == [str(mount / "prep" / "__init__.py"), "True"]


FULL_CACHE_CHECK = """
import numpy as np
from prep.neardup import kernel
from prep.neardup.signatures import packed, signatures
blob, offsets = packed([b"a b c d e f", b"one two three four five six seven", b""])
print(kernel.compiled() is None, signatures(blob, offsets, 3, 16, 1).tolist())
"""


def test_a_full_disk_under_numbas_cache_folder_leaves_the_same_signatures_to_numpy(tmp_path: Path) -> None:
    """numba stores each loop it compiles in its cache folder; with that disk full, the kernels are
    given up for numpy's (the same values), said in one line on stderr, instead of OSError
    raised through every near-dup build."""
    with small_tmpfs(tmp_path / "cache", "64k") as folder:
        fill_up(folder)
        environment = {**os.environ, "NUMBA_CACHE_DIR": str(folder / "numba")}
        done = subprocess.run([sys.executable, "-c", FULL_CACHE_CHECK], env=environment, cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    blob, offsets = packed([b"a b c d e f", b"one two three four five six seven", b""])
    with patch.object(kernel, "chosen", lambda products: None):
        expected = signatures(blob, offsets, 3, 16, 1).tolist()
    assert done.stdout.strip() == f"True {expected}"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("prep: warning: near-duplicate kernels")]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], done.stderr[-2000:]
