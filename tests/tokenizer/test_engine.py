"""The engine turns a panic inside a Rust tokenizer (pyo3's PanicException, a BaseException) into
one TokenizerError naming what it was doing, instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prep.errors import TokenizerError
from prep.tokenizer import engine as engine_module
from prep.tokenizer import load_tokenizer
from prep.tokenizer.engine import TokenizerEngine
from tests.tokenizer.conftest import EOS


class PanicException(BaseException):
    """Named like pyo3's (pyo3_runtime.PanicException), which derives from BaseException."""


def _panic(*_: object) -> None:
    raise PanicException("called `Option::unwrap()` on a `None` value")


def _engine(path: Path, kind: str) -> TokenizerEngine:
    tokenizer, info = load_tokenizer(path, EOS)
    return TokenizerEngine.create(kind, path, tokenizer, info, 1)


@pytest.mark.parametrize("kind", ["gigatoken", "tokenizers"])
def test_a_panic_while_encoding_is_one_tokenizer_error_naming_the_batch(bpe_path: Path, kind: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(bpe_path, kind)
    blob = b"hello worldgood morning"
    offsets = np.array([0, 11, len(blob)], dtype=np.int64)
    assert len(engine.encode_columns(blob, offsets, ["a.jsonl:0:0", "a.jsonl:0:1"])[0])
    monkeypatch.setattr(engine.backend, "encode_flat", _panic)
    with pytest.raises(TokenizerError, match=r"crashed \(a Rust panic\) encoding the batch that starts at "
                                             r"a\.jsonl:0:0: called `Option::unwrap\(\)`"):
        engine.encode_columns(blob, offsets, ["a.jsonl:0:0", "a.jsonl:0:1"])


def test_a_panic_while_loading_is_one_tokenizer_error_naming_the_file(bpe_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "make_backend", _panic)
    with pytest.raises(TokenizerError, match=rf"crashed \(a Rust panic\) loading {bpe_path}"):
        _engine(bpe_path, "gigatoken")


def test_other_base_exceptions_pass_through(bpe_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(bpe_path, "tokenizers")

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.backend, "encode_flat", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.encode_columns(b"hi", np.array([0, 2], dtype=np.int64), ["a.jsonl:0:0"])
