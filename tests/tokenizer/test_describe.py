"""The cached tokenizer description is keyed by content: it equals a fresh load, follows any edit
of the file, and a broken cache entry is never trusted over the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prep.errors import TokenizerError
from prep.tokenizer import describe_tokenizer, load_tokenizer

EOS = "<|endoftext|>"


@pytest.mark.parametrize("encode_special_tokens", [True, False])
def test_description_equals_a_fresh_load_and_follows_edits(tokenizer_path: Path, tmp_path: Path,
                                                           encode_special_tokens: bool) -> None:
    path = tmp_path / "tokenizer.json"
    shutil.copy(tokenizer_path, path)
    fresh = load_tokenizer(path, EOS, encode_special_tokens)[1]
    assert describe_tokenizer(path, EOS, encode_special_tokens) == fresh
    assert describe_tokenizer(path, EOS, encode_special_tokens) == fresh  # from the cache

    definition = json.loads(path.read_text())
    definition["added_tokens"].append({"id": max(definition["model"]["vocab"].values()) + 50, "content": "<|new|>",
                                       "single_word": False, "lstrip": False, "rstrip": False,
                                       "normalized": False, "special": True})
    path.write_text(json.dumps(definition))  # same path, same size class, new content
    edited = describe_tokenizer(path, EOS, encode_special_tokens)
    assert edited == load_tokenizer(path, EOS, encode_special_tokens)[1]
    assert edited.sha256 != fresh.sha256 and "<|new|>" in edited.special_tokens


def test_errors_are_those_of_a_load(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not found"):
        describe_tokenizer(tmp_path / "missing.json", EOS)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(TokenizerError, match="not a valid tokenizers file"):
        describe_tokenizer(broken, EOS)


def test_a_damaged_cache_entry_is_not_trusted(tokenizer_path: Path) -> None:
    from prep.machinecache import cache_root

    fresh = describe_tokenizer(tokenizer_path, EOS)
    for entry in (cache_root() / "tokenizer-info").glob("*.json"):
        entry.write_text('{"sha256": "0"}')
    assert describe_tokenizer(tokenizer_path, EOS) == fresh


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_tokenizer_path_that_is_no_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """Regression: a FIFO as tokenizer.path blocked the build forever in read_bytes()."""
    import os

    path = tmp_path / "tokenizer.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    for load in (describe_tokenizer, load_tokenizer):
        with pytest.raises(TokenizerError, match="not a regular file; the tokenizer must be a file"):
            load(path, EOS)


def test_a_description_cached_by_older_rules_is_not_served(tokenizer_path: Path) -> None:
    """Regression: the cache key named the file and settings but not the rules, so a description
    cached before vocab_size counted up to the largest id was still served (a wrong dtype)."""
    import dataclasses
    import hashlib

    from prep.machinecache import cache_root

    fresh = load_tokenizer(tokenizer_path, EOS)[1]
    old_key = hashlib.sha256(json.dumps([fresh.sha256, EOS, True]).encode()).hexdigest()
    stale = dataclasses.replace(fresh, vocab_size=fresh.vocab_size - 1)
    (cache_root() / "tokenizer-info").mkdir(parents=True, exist_ok=True)
    (cache_root() / "tokenizer-info" / f"{old_key}.json").write_text(json.dumps(dataclasses.asdict(stale)))
    assert describe_tokenizer(tokenizer_path, EOS) == fresh
