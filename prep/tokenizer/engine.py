"""The tokenize stage's view of tokenization: the chosen backend plus the reference cross-check.

With the reference backend there is nothing to cross-check. With a fast backend, every batch
re-encodes a byte-bounded, deterministic sample with the reference and fails on any difference,
naming the document.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from prep.errors import TokenizerError
from prep.tokenizer import TokenizerInfo, UnencodableDocument
from prep.tokenizer.backends import Backend, ReferenceBackend, make_backend
from prep.tokenizer.crosscheck import crosscheck, sample_budget, select_sample
from prep.tokenizer.spans import SpanTexts, TokenSpans


@contextmanager
def rust_panics_reported(doing: str) -> Iterator[None]:
    """A panic inside a Rust tokenizer arrives as pyo3's PanicException, a BaseException that no
    `except Exception` sees (a traceback for the user): it becomes one TokenizerError here."""
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != "PanicException":
            raise
        raise TokenizerError(f"the tokenizer library crashed (a Rust panic) {doing}: {exc}") from None


@dataclass
class TokenizerEngine:
    """Encodes document batches; `report()` gives the figures a build's log records."""

    info: TokenizerInfo
    backend: Backend
    reference: ReferenceBackend
    checked: dict[str, int] = field(default_factory=lambda: {"documents": 0, "bytes": 0, "batches": 0})

    @classmethod
    def create(cls, kind: str, path: Path, tokenizer: Tokenizer, info: TokenizerInfo, threads: int) -> TokenizerEngine:
        with rust_panics_reported(f"loading {path}"):
            backend = make_backend(kind, path, tokenizer, info, threads)
        reference = backend if isinstance(backend, ReferenceBackend) else ReferenceBackend(
            tokenizer, np.dtype(info.dtype), str(path))
        return cls(info, backend, reference)

    def encode_columns(self, blob: bytes, offsets: np.ndarray[Any, Any],
                       names: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Encode the valid UTF-8 texts `blob[offsets[i]:offsets[i + 1]]` (named `names` in errors)
        into one token array and its n + 1 offsets, and cross-check a sample of them."""
        with rust_panics_reported(f"encoding the batch that starts at {names[0] if names else 'its first document'}"):
            return self._encode_columns(blob, offsets, names)

    def _encode_columns(self, blob: bytes, offsets: np.ndarray[Any, Any],
                        names: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        try:
            tokens, token_offsets = self.backend.encode_flat(blob, offsets)
        except UnencodableDocument as exc:
            raise exc.at(exc.index, names[exc.index]) from None
        if self.backend is not self.reference and len(offsets) > 1:
            texts = SpanTexts(blob, offsets)
            indices = select_sample(texts, sample_budget(int(offsets[-1])), seed=zlib.crc32(names[0].encode()),
                                    special_tokens=self.info.special_tokens, utf8=(blob, offsets))
            report = crosscheck(self.backend, self.reference, texts, TokenSpans(tokens, token_offsets), indices, names)
            self.checked["documents"] += report.documents
            self.checked["bytes"] += report.bytes
            self.checked["batches"] += 1
        return tokens, token_offsets

    def report(self) -> dict[str, Any]:
        """Backend name and version, and how much the cross-check compared."""
        return {"backend": self.backend.name, "backend_version": self.backend.version,
                "crosscheck_documents": self.checked["documents"], "crosscheck_bytes": self.checked["bytes"],
                "crosscheck_batches": self.checked["batches"]}
