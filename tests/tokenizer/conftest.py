"""Tokenizers trained here (no downloads) and backends built from them, shared by the module."""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer

from prep.sample import train_tokenizer
from prep.tokenizer import load_tokenizer
from prep.tokenizer.backends import GigatokenBackend, ReferenceBackend

EOS = "<|endoftext|>"
# Script ranges (first, last code point) the training text draws words from, so merges exist
# for several writing systems and not only for ASCII.
SCRIPTS = ((0x61, 0x7A), (0xE0, 0xFF), (0x3B1, 0x3C9), (0x430, 0x44F), (0x5D0, 0x5EA), (0x627, 0x64A),
           (0x905, 0x939), (0xE01, 0xE2E), (0x3041, 0x3096), (0x4E00, 0x4FFF), (0xAC00, 0xAD00),
           (0x1F600, 0x1F64F))
PUNCTUATION = (" ", " ", " ", ", ", ". ", "\n", "\r\n", "'s ", "'ll ", " 2024 ", " 3.14 ", "\t", "  ", "!")


def _synthetic_text(rng: random.Random, words: int) -> str:
    low, high = rng.choice(SCRIPTS)
    pieces = []
    for _ in range(words):
        pieces.append("".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 8))))
        pieces.append(rng.choice(PUNCTUATION))
    return "".join(pieces)


def _python_sources(limit: int) -> Iterator[str]:
    """Real code from the standard library, in sorted order so the corpus is reproducible."""
    used = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        used += len(text)
        yield text
        if used >= limit:
            return


def training_texts() -> list[str]:
    """About 400 KB of varied text: Python source plus words in a dozen scripts."""
    rng = random.Random(11)
    return list(_python_sources(200_000)) + [_synthetic_text(rng, 30) for _ in range(600)]


@pytest.fixture(scope="session")
def bpe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2-style byte-level BPE, vocab 1500, with <|endoftext|> as its special token."""
    return train_tokenizer(training_texts(), 1500, tmp_path_factory.mktemp("bpe") / "tokenizer.json", EOS)


@pytest.fixture(scope="session")
def rich_bpe_path(bpe_path: Path) -> Path:
    """The same BPE plus more special tokens (one stripping spaces) and plain added tokens,
    one of which spells part of a special token."""
    tokenizer = Tokenizer.from_file(str(bpe_path))
    tokenizer.add_special_tokens([AddedToken("<|im_start|>", special=True),
                                  AddedToken("<pad>", special=True, lstrip=True, rstrip=True)])
    tokenizer.add_tokens([AddedToken("endoftext", special=False, normalized=False),
                          AddedToken("hello world", special=False)])
    path = bpe_path.with_name("rich-tokenizer.json")
    tokenizer.save(str(path))
    return path


BackendPair = tuple[GigatokenBackend, ReferenceBackend]


@pytest.fixture(scope="session")
def backends(bpe_path: Path, rich_bpe_path: Path) -> Callable[..., BackendPair]:
    """backends(rich, encode_special_tokens, threads) -> (gigatoken, reference), built once each."""
    cache: dict[tuple[bool, bool, int], BackendPair] = {}

    def get(rich: bool = False, encode_special_tokens: bool = True, threads: int = 1) -> BackendPair:
        key = (rich, encode_special_tokens, threads)
        if key not in cache:
            path = rich_bpe_path if rich else bpe_path
            tokenizer, info = load_tokenizer(path, EOS, encode_special_tokens)
            reference = ReferenceBackend(tokenizer, np.dtype(info.dtype))
            cache[key] = (GigatokenBackend(path.read_text(encoding="utf-8"), reference, info, threads), reference)
        return cache[key]

    return get
