"""The tokenize stage's view of tokenization: the chosen backend plus the reference cross-check.

With the reference backend there is nothing to cross-check. With a fast backend, every batch
re-encodes a byte-bounded, deterministic sample with the reference and fails on any difference,
naming the document.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from prep.tokenizer import TokenizerInfo
from prep.tokenizer.backends import Backend, ReferenceBackend, make_backend
from prep.tokenizer.crosscheck import crosscheck, sample_budget, select_sample, utf8_size
from prep.tokenizer.spans import SpanTexts, TokenSpans


@dataclass
class TokenizerEngine:
    """Encodes document batches; `report()` gives the figures a build's log records."""

    info: TokenizerInfo
    backend: Backend
    reference: ReferenceBackend
    checked: dict[str, int] = field(default_factory=lambda: {"documents": 0, "bytes": 0, "batches": 0})

    @classmethod
    def create(cls, kind: str, path: Path, tokenizer: Tokenizer, info: TokenizerInfo, threads: int) -> TokenizerEngine:
        backend = make_backend(kind, path, tokenizer, info, threads)
        reference = backend if isinstance(backend, ReferenceBackend) else ReferenceBackend(tokenizer, np.dtype(info.dtype))
        return cls(info, backend, reference)

    def encode_batch(self, texts: list[str], names: Sequence[str],
                     utf8: tuple[bytes, np.ndarray[Any, Any]] | None = None) -> list[np.ndarray[Any, Any]]:
        """Encode `texts` (named `names` in errors; `utf8` is `crosscheck.utf8_batch(texts)` when the
        caller has it) and cross-check a sample of them."""
        tokens = self.backend.encode_batch(texts)
        if self.backend is not self.reference and texts:
            self._crosscheck(texts, tokens, names, utf8)
        return tokens

    def encode_columns(self, blob: bytes, offsets: np.ndarray[Any, Any],
                       names: Sequence[str]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Encode the valid UTF-8 texts `blob[offsets[i]:offsets[i + 1]]` (named `names` in errors)
        into one token array and its n + 1 offsets, and cross-check a sample of them."""
        tokens, token_offsets = self.backend.encode_flat(blob, offsets)
        if self.backend is not self.reference and len(offsets) > 1:
            self._crosscheck(SpanTexts(blob, offsets), TokenSpans(tokens, token_offsets), names, (blob, offsets))
        return tokens, token_offsets

    def _crosscheck(self, texts: Sequence[str], tokens: Sequence[np.ndarray[Any, Any]], names: Sequence[str],
                    utf8: tuple[bytes, np.ndarray[Any, Any]] | None) -> None:
        budget = sample_budget(int(utf8[1][-1]) if utf8 is not None else sum(map(utf8_size, texts)))
        indices = select_sample(texts, budget, seed=zlib.crc32(names[0].encode()),
                                special_tokens=self.info.special_tokens, utf8=utf8)
        report = crosscheck(self.backend, self.reference, texts, tokens, indices, names)
        self.checked["documents"] += report.documents
        self.checked["bytes"] += report.bytes
        self.checked["batches"] += 1

    def report(self) -> dict[str, Any]:
        """Backend name and version, and how much the cross-check compared."""
        return {"backend": self.backend.name, "backend_version": self.backend.version,
                "crosscheck_documents": self.checked["documents"], "crosscheck_bytes": self.checked["bytes"],
                "crosscheck_batches": self.checked["batches"]}
