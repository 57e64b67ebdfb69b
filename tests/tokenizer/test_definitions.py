"""Unusual tokenizer definitions: ids past the vocabulary's size, added tokens gigatoken cannot
match as the reference does, a model that fails on some text, a file replaced after its load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer

from prep.errors import TokenizerError
from prep.tokenizer import load_tokenizer
from prep.tokenizer.backends import GigatokenBackend, ReferenceBackend, make_backend
from prep.tokenizer.engine import TokenizerEngine
from prep.tokenizer.spans import offsets_of
from tests.helpers import run_prep, write_jsonl, write_pipeline
from tests.tokenizer.conftest import EOS


@pytest.fixture(autouse=True)
def _restore_thread_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """make_backend sets thread variables for the process; undo that after each test."""
    monkeypatch.setenv("RAYON_NUM_THREADS", "2")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")


def _edited(source: Path, path: Path, edit: dict[str, object]) -> Path:
    definition = json.loads(source.read_text(encoding="utf-8"))
    definition["model"] = {**definition["model"], **edit}
    path.write_text(json.dumps(definition), encoding="utf-8")
    return path


def _batch(texts: list[str]) -> tuple[bytes, np.ndarray]:
    encoded = [text.encode() for text in texts]
    return b"".join(encoded), offsets_of([len(data) for data in encoded])


def test_ids_past_the_vocabulary_size_widen_the_dtype(tokenizer_path: Path, tmp_path: Path) -> None:
    """Regression: the dtype followed the number of ids, not the largest, so ids over 65,535 in a
    small vocabulary overflowed uint16 (a traceback in every build)."""
    vocab = json.loads(tokenizer_path.read_text(encoding="utf-8"))["model"]["vocab"]
    path = _edited(tokenizer_path, tmp_path / "sparse.json",
                   {"vocab": {token: index + 70_000 if index else 0 for token, index in vocab.items()}})
    tokenizer, info = load_tokenizer(path, EOS)
    assert (info.vocab_size, info.dtype) == (max(vocab.values()) + 70_001, "int32")
    expected = tokenizer.encode("alpha beta", add_special_tokens=False).ids
    assert min(expected) > 65_535
    for kind in ("tokenizers", "gigatoken"):
        assert make_backend(kind, path, tokenizer, info, 1).encode_batch(["alpha beta"])[0].tolist() == expected


def _late_added_tokens(tokenizer_path: Path, path: Path, late: list[AddedToken]) -> Path:
    """The tokenizer with 70 plain added tokens (more than the load check probes in context), then `late`."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.add_tokens([AddedToken(f"<t{i}>") for i in range(70)] + late)
    tokenizer.save(str(path))
    return path


def _renumbered(tokenizer_path: Path, path: Path) -> Path:
    """A file numbering its last added token unlike the reference, which numbers them in order."""
    _late_added_tokens(tokenizer_path, path, [AddedToken("<late>")])
    definition = json.loads(path.read_text(encoding="utf-8"))
    definition["added_tokens"][-1]["id"] += 1000
    path.write_text(json.dumps(definition), encoding="utf-8")
    return path


LATE_TOKENS = {
    "renumbered": (_renumbered, "disagrees with the reference on the probe '<late>'"),
    "single_word": (lambda source, path: _late_added_tokens(source, path, [AddedToken("<late>", single_word=True)]),
                    "added token '<late>' is single_word, which gigatoken ignores"),
    "stripping": (lambda source, path: _late_added_tokens(source, path, [AddedToken("<late>", rstrip=True),
                                                                         AddedToken("  ")]),
                  "added token '<late>' strips whitespace and added token '  ' begins or ends with whitespace"),
}


@pytest.mark.parametrize("kind", sorted(LATE_TOKENS))
def test_added_tokens_gigatoken_would_match_differently_make_it_unusable(tokenizer_path: Path, tmp_path: Path,
                                                                         kind: str) -> None:
    """Regression: only the first 64 added tokens were probed, so gigatoken loaded these and gave other
    ids than the reference for text holding the last one ("x<late>y", "<late>  ", "<late>")."""
    make, reason = LATE_TOKENS[kind]
    path = make(tokenizer_path, tmp_path / f"{kind}.json")
    tokenizer, info = load_tokenizer(path, EOS)
    assert isinstance(make_backend("auto", path, tokenizer, info, 1), ReferenceBackend)
    with pytest.raises(TokenizerError, match=f"gigatoken is unusable: .*{reason}"):
        make_backend("gigatoken", path, tokenizer, info, 1)


def test_a_file_replaced_after_its_load_is_refused(tokenizer_path: Path, tmp_path: Path) -> None:
    """Regression: make_backend read the file again for gigatoken, so a file replaced after the
    reference was loaded gave the two libraries different tokenizers (here an added token the
    reference lacks, which no probe looks for)."""
    path = tmp_path / "tokenizer.json"
    shutil.copy(tokenizer_path, path)
    tokenizer, info = load_tokenizer(path, EOS)
    _late_added_tokens(tokenizer_path, path, [])
    for kind in ("auto", "gigatoken"):
        with pytest.raises(TokenizerError, match=f"{path}: tokenizer file changed while it was read"):
            make_backend(kind, path, tokenizer, info, 1)


def _word_level_without_unk(tokenizer_path: Path, path: Path) -> Path:
    return _edited(tokenizer_path, path, {"type": "WordLevel", "vocab": {EOS: 0, "known": 1}, "unk_token": "<unk>"})


def test_a_document_the_tokenizer_cannot_encode_is_named(tokenizer_path: Path, tmp_path: Path) -> None:
    """Regression: tokenizers' own error (a word unknown to a model without its unk token) escaped
    as a bare Exception, a traceback instead of one error line."""
    path = _word_level_without_unk(tokenizer_path, tmp_path / "word-level.json")
    tokenizer, info = load_tokenizer(path, EOS)
    engine = TokenizerEngine.create("auto", path, tokenizer, info, 1)
    assert engine.backend is engine.reference
    tokens, _ = engine.encode_columns(*_batch(["known", "known"]), ["a:0", "a:1"])
    assert tokens.tolist() == [1, 1]
    with pytest.raises(TokenizerError, match=f"^{path}: the tokenizer cannot encode document a:2: WordLevel error"):
        engine.encode_columns(*_batch(["known", "", "unknown", "known"]), ["a:0", "a:1", "a:2", "a:3"])


def test_a_routed_document_the_reference_cannot_encode_is_named(bpe_path: Path, tokenizer_path: Path,
                                                                tmp_path: Path) -> None:
    """The same error from a document gigatoken routes to the reference names that document."""
    tokenizer, info = load_tokenizer(bpe_path, EOS)
    fast = GigatokenBackend(bpe_path.read_text(encoding="utf-8"), ReferenceBackend(tokenizer, np.dtype(info.dtype)),
                            info, 1)
    failing, _ = load_tokenizer(_word_level_without_unk(tokenizer_path, tmp_path / "word-level.json"), EOS)
    fast._reference = ReferenceBackend(failing, np.dtype(info.dtype), "ref.json")
    with pytest.raises(TokenizerError, match="^ref.json: the tokenizer cannot encode document 2 of the batch"):
        fast.encode_flat(*_batch(["plain", "more plain", "routed \u0378"]))


def test_a_build_whose_tokenizer_fails_on_a_document_is_one_error_line(tokenizer_path: Path, tmp_path: Path) -> None:
    path = _word_level_without_unk(tokenizer_path, tmp_path / "word-level.json")
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": "0", "text": "known"}, {"id": "1", "text": "unknown"}])
    pipeline = write_pipeline(tmp_path, path, backend="auto")
    result = run_prep("build", pipeline, "--store", tmp_path / "store", check=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("prep: error:")]
    assert errors == [f"prep: error: {path}: the tokenizer cannot encode document a.jsonl:0:1: "
                      "WordLevel error: Missing [UNK] token from the vocabulary"]
    assert not list((tmp_path / "store").glob("refs/**/*.json"))


@pytest.mark.parametrize("dropout", [0.5, 1e-6])
def test_bpe_dropout_is_refused(tokenizer_path: Path, tmp_path: Path, dropout: float) -> None:
    """Regression: a file with BPE dropout loaded, and the reference then skipped random merges, so
    a rerun wrote other tokens (and gigatoken's cross-check failed at random)."""
    path = _edited(tokenizer_path, tmp_path / "dropout.json", {"dropout": dropout})
    with pytest.raises(TokenizerError, match=f"^{path}: model.dropout is {dropout:g}: BPE dropout makes the tokens"):
        load_tokenizer(path, EOS)
    load_tokenizer(_edited(tokenizer_path, tmp_path / "no-dropout.json", {"dropout": 0.0}), EOS)
