"""The cross-check's sample is deterministic, byte-bounded and favours unusual documents; a backend
that disagrees with the reference on one document is caught and the document named."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import prep.tokenizer.crosscheck as crosscheck_module
from prep.errors import TokenizerError
from prep.tokenizer import load_tokenizer
from prep.tokenizer.backends import Backend
from prep.tokenizer.crosscheck import (
    DEFAULT_BUDGET_FRACTION,
    MAX_BUDGET_BYTES,
    MIN_BUDGET_BYTES,
    CrossCheckReport,
    crosscheck,
    first_difference,
    sample_budget,
    select_sample,
    unusual_score,
    utf8_batch,
    utf8_size,
)
from prep.tokenizer.engine import TokenizerEngine
from prep.tokenizer.spans import SpanTexts, TokenArray, offsets_of
from tests.tokenizer.conftest import EOS, BackendPair
from tests.tokenizer.strategies import documents

Backends = Callable[..., BackendPair]


class PerturbingBackend:
    """A real backend whose output for one chosen document is off by one token id."""

    name = "perturbing"
    version = "0"

    def __init__(self, inner: Backend, victim: str) -> None:
        self.inner = inner
        self.victim = victim

    def encode_batch(self, texts: list[str]) -> list[TokenArray]:
        tokens = self.inner.encode_batch(texts)
        for index, text in enumerate(texts):
            if text == self.victim:
                tokens[index] = tokens[index].copy()
                tokens[index][-1] += 1
        return tokens

    def encode_flat(self, blob: bytes, offsets: np.ndarray[Any, Any]) -> tuple[TokenArray, np.ndarray[Any, Any]]:
        tokens = self.encode_batch(list(SpanTexts(blob, offsets)))
        return np.concatenate(tokens), offsets_of([len(t) for t in tokens])

    def close(self) -> None:
        self.inner.close()


def ordinary_corpus(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    words = ("the", "model", "reads", "a", "shard", "of", "tokens", "and", "writes", "an", "index", "for", "each")
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) + "." for _ in range(count)]


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(documents, max_size=40), budget=st.integers(0, 4000), seed=st.integers(0, 2**40))
def test_sample_is_deterministic_sorted_and_within_budget(texts: list[str], budget: int, seed: int) -> None:
    sample = select_sample(texts, budget, seed)
    assert sample == select_sample(list(texts), budget, seed)
    assert sample == sorted(set(sample))
    assert all(0 <= index < len(texts) for index in sample)
    assert sum(utf8_size(texts[index]) for index in sample) <= budget


_PIECES = ["word ", "é", "\r", "<|", "<|endoftext|>", "数据", "x" * 300, "\ud800"]


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), min_size=1, max_size=30),
       budget=st.integers(0, 2000))
def test_cheap_scores_of_the_documents_within_budget_are_the_whole_batchs(texts: list[str], budget: int) -> None:
    """The cheap checks look only at documents a sample can take, copied out when they are few
    (long documents), scanned in place otherwise: either way each gets what a scan of the whole
    batch gives it, and every other document zero."""
    blob, offsets = utf8_batch(texts)
    fit = np.flatnonzero(np.diff(offsets) <= budget)
    chars, cheap = crosscheck_module._cheap_scores(blob, offsets, fit, ["<|endoftext|>"])
    whole_chars, whole_cheap = crosscheck_module._cheap_scores(blob, offsets, np.arange(len(texts)), ["<|endoftext|>"])
    assert chars[fit].tolist() == whole_chars[fit].tolist() and cheap[fit].tolist() == whole_cheap[fit].tolist()
    outside = np.setdiff1d(np.arange(len(texts)), fit)
    assert not chars[outside].any() and not cheap[outside].any()
    assert whole_chars.tolist() == [len(text) for text in texts]
    assert whole_cheap.tolist() == [crosscheck_module._cheap_score(text, ("<|endoftext|>",)) for text in texts]


def test_sample_depends_on_the_seed() -> None:
    texts = ordinary_corpus(400)
    assert select_sample(texts, 4000, seed=1) != select_sample(texts, 4000, seed=2)


def test_sample_favours_unusual_documents_and_keeps_ordinary_ones() -> None:
    texts = ordinary_corpus(1000)
    unusual_text = ["naïve café", "tab\tand\r\nCRLF", "spells <|endoftext|>", "digits 12345678901234567890",
                    "word " + "x" * 150, "ctrl \x1b[0m", "spaces" + " " * 40 + "end"]
    rng = random.Random(5)
    unusual = set(rng.sample(range(len(texts)), 50))
    for number, index in enumerate(sorted(unusual)):
        texts[index] += " " + unusual_text[number % len(unusual_text)]
    budget = 8000
    sample = select_sample(texts, budget, seed=3, special_tokens=["<|endoftext|>"])
    picked_unusual = [index for index in sample if index in unusual]
    picked_ordinary = [index for index in sample if index not in unusual]
    assert len(picked_unusual) / len(sample) > 4 * len(unusual) / len(texts)
    assert picked_ordinary
    assert sum(utf8_size(texts[index]) for index in picked_ordinary) <= budget


def test_unusual_score_counts_kinds_of_unusual_content() -> None:
    assert unusual_score("just some words. And numbers 12.") == 0
    assert unusual_score("café") == 1
    assert unusual_score("line\r\n") == 1
    assert unusual_score("x <|im_end|> y") == 1  # looks like a special token
    assert unusual_score("x MYSPECIAL y", special_tokens=["MYSPECIAL"]) == 1
    assert unusual_score("9" * 16) == 1 and unusual_score(" " * 32) == 1 and unusual_score("w" * 100) == 1
    assert unusual_score("naïve\r\n<|endoftext|>" + "0" * 20) == 4


def test_documents_larger_than_the_budget_are_never_sampled() -> None:
    texts = ["small one", "big " * 1000, "small two"]
    assert select_sample(texts, 100, seed=0) == [0, 2]
    assert select_sample(texts, 0, seed=0) == []
    assert select_sample([], 100, seed=0) == []


def test_sample_budget_is_a_bounded_fraction() -> None:
    assert sample_budget(0) == MIN_BUDGET_BYTES
    assert sample_budget(50 << 20) == int((50 << 20) * DEFAULT_BUDGET_FRACTION) > MIN_BUDGET_BYTES
    assert sample_budget(10 << 30) == MAX_BUDGET_BYTES


def test_crosscheck_passes_and_reports_what_it_checked(backends: Backends) -> None:
    fast, reference = backends(False, True, 1)
    texts = ordinary_corpus(200) + ["naïve <|endoftext|>", "数据 🙂\r\n"]
    names = [f"docs.jsonl:{i}" for i in range(len(texts))]
    sample = select_sample(texts, 3000, seed=7)
    report = crosscheck(fast, reference, texts, fast.encode_batch(texts), sample, names)
    assert report == CrossCheckReport(documents=len(sample), bytes=sum(utf8_size(texts[i]) for i in sample))
    assert 0 < report.bytes <= 3000


def test_crosscheck_catches_and_names_a_disagreeing_document(backends: Backends) -> None:
    fast, reference = backends(False, True, 1)
    texts = ordinary_corpus(300)
    victim = 137
    texts[victim] = "an unusual one: naïve <|endoftext|> 1234567890123456789"
    broken = PerturbingBackend(fast, texts[victim])
    names = [f"shard-3.jsonl:{i + 1}" for i in range(len(texts))]
    tokens = broken.encode_batch(texts)
    sample = select_sample(texts, 2000, seed=11, special_tokens=["<|endoftext|>"])
    assert victim in sample  # the unusual document is favoured
    last = len(tokens[victim]) - 1
    with pytest.raises(TokenizerError, match=rf"^tokenizer backend perturbing disagrees with the reference "
                                             rf"on document shard-3.jsonl:138: first difference at token {last}$"):
        crosscheck(broken, reference, texts, tokens, sample, names)
    others = [index for index in sample if index != victim]
    assert crosscheck(broken, reference, texts, tokens, others, names).documents == len(others)


def test_the_engine_catches_a_disagreement_in_a_flat_batch(backends: Backends, bpe_path: Path) -> None:
    """The tokenize stage's path (whole batches as one buffer) cross-checks as the list path does."""
    fast, reference = backends(False, True, 1)
    texts = ordinary_corpus(300)
    texts[41] = "an unusual one: naïve <|endoftext|> 1234567890123456789"
    engine = TokenizerEngine(load_tokenizer(bpe_path, EOS)[1], PerturbingBackend(fast, texts[41]), reference)
    blob, offsets = utf8_batch(texts)
    names = [f"part.jsonl:0:{i}" for i in range(len(texts))]
    with pytest.raises(TokenizerError, match=r"disagrees with the reference on document part.jsonl:0:41:"):
        engine.encode_columns(blob, offsets, names)
    texts[41] = "ordinary again"
    blob, offsets = utf8_batch(texts)
    tokens, token_offsets = engine.encode_columns(blob, offsets, names)
    assert [tokens[a:b].tolist() for a, b in zip(token_offsets[:-1], token_offsets[1:])] == [
        t.tolist() for t in reference.encode_batch(texts)]
    assert engine.checked["documents"] > 0


def test_crosscheck_skips_the_reference_itself(backends: Backends) -> None:
    _, reference = backends(False, True, 1)
    texts = ["a", "b"]
    report = crosscheck(reference, reference, texts, reference.encode_batch(texts), [0, 1], ["x", "y"])
    assert report == CrossCheckReport(documents=0, bytes=0)


def test_first_difference() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.uint16)
    assert first_difference(a, np.array([1, 2, 9, 4], dtype=np.uint16)) == 2
    assert first_difference(a, a[:3]) == 3
    assert first_difference(a[:0], a) == 0


def reference_select_sample(texts: list[str], budget_bytes: int, seed: int, special_tokens: tuple[str, ...]) -> list[int]:
    """select_sample's rule one document at a time (the shape it had before its numpy form)."""
    if budget_bytes <= 0 or not texts:
        return []
    order = np.random.RandomState(seed % 2**32).permutation(len(texts))
    ordinary: list[int] = []
    unusual: list[tuple[int, int]] = []
    scanned = 0
    for rank, index in enumerate(order.tolist()):
        text = texts[index]
        if utf8_size(text) > budget_bytes:  # bytes, as the budget: such a document can never be taken
            continue
        score = unusual_score(text, special_tokens) if scanned < 2 * budget_bytes else (
            (0 if text.isascii() else 1) + ("\r" in text) + ("<|" in text or any(t in text for t in special_tokens)))
        if scanned < 2 * budget_bytes:
            scanned += len(text)
        if score:
            unusual.append((-score, rank))
        else:
            ordinary.append(index)
    unusual.sort()
    chosen: list[int] = []
    used = 0

    def take(pending: list[int], limit: int) -> list[int]:
        nonlocal used
        left = []
        for index in pending:
            if used < limit and used + utf8_size(texts[index]) <= limit:
                chosen.append(index)
                used += utf8_size(texts[index])
            else:
                left.append(index)
        return left

    ordinary = take(ordinary, budget_bytes // 4)
    take([int(order[rank]) for _, rank in unusual], budget_bytes)
    take(ordinary, budget_bytes)
    return sorted(chosen)


_ODD_TEXTS = st.lists(st.lists(st.sampled_from(["a", " ", "\r", "<", "|", "é", "\x01", "7", "X", "😀", "\ud800",
                                               "<|endoftext|>", "[SEP]", " " * 40]), max_size=30).map("".join),
                      max_size=60)


@settings(max_examples=300, deadline=None)
@given(texts=_ODD_TEXTS, budget=st.integers(0, 400), seed=st.integers(0, 2**32),
       specials=st.sampled_from([(), ("<|endoftext|>",), ("[SEP]", "<|x|>")]))
# Found by a random run: a document of 171 characters and 172 bytes under a budget of 171 (the
# rule had skipped documents larger than the budget by characters, the numpy form by bytes).
@example(texts=["", "", "aaa[SEP]" + " " * 120, "", "", "aaa", "\x01",
                "aaaaaaaaaaaaaa\u00e9<|endoftext|><|endoftext|>[SEP][SEP]" + " " * 120, " " * 40],
         budget=171, seed=131, specials=())
def test_select_sample_matches_the_per_document_rule(texts: list[str], budget: int, seed: int,
                                                     specials: tuple[str, ...]) -> None:
    """The numpy form picks exactly what the per-document rule picks, lone surrogates included."""
    assert select_sample(texts, budget, seed, special_tokens=specials) == reference_select_sample(texts, budget, seed,
                                                                                                  specials)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(alphabet="ab<|é\r", max_size=12), max_size=12),
       needles=st.lists(st.text(alphabet="ab<|é", min_size=1, max_size=4), max_size=3))
def test_documents_containing_agrees_with_in(texts: list[str], needles: list[str]) -> None:
    from prep.tokenizer.spans import documents_containing

    blob, offsets = utf8_batch(texts)
    found = documents_containing(blob, offsets, [needle.encode() for needle in needles])
    assert found.tolist() == [any(needle in text for needle in needles) for text in texts]
