"""The tokenize stage's view of tokenization: a chosen backend plus the reference cross-check.

With the reference backend there is nothing to cross-check. With a fast backend, every batch
re-encodes a byte-bounded, deterministic sample with the reference and fails on any difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from prep.tokenizer import TokenizerInfo, reference_encode_batch


@dataclass
class TokenizerEngine:
    """Encodes document batches; `report()` gives the figures a build's log records."""

    tokenizer: Tokenizer
    info: TokenizerInfo
    backend: Any = None  # a prep.tokenizer.backends.Backend, or None for the reference
    crosscheck_budget: int = 0
    checked: dict[str, int] = field(default_factory=lambda: {"documents": 0, "bytes": 0})

    @classmethod
    def create(cls, kind: str, path: Path, tokenizer: Tokenizer, info: TokenizerInfo, threads: int) -> TokenizerEngine:
        if kind == "tokenizers":
            return cls(tokenizer, info)
        from prep.tokenizer.backends import ReferenceBackend, make_backend
        from prep.tokenizer.crosscheck import DEFAULT_BUDGET_FRACTION

        backend = make_backend(kind, path, tokenizer, info, threads)
        if isinstance(backend, ReferenceBackend):
            return cls(tokenizer, info)
        return cls(tokenizer, info, backend, crosscheck_budget=int(DEFAULT_BUDGET_FRACTION * 1_000_000))

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(self.info.dtype)

    def encode_batch(self, texts: list[str], names: list[str]) -> list[np.ndarray]:
        if self.backend is None:
            return reference_encode_batch(self.tokenizer, texts, self.dtype)
        from prep.tokenizer.crosscheck import crosscheck, select_sample

        tokens: list[np.ndarray] = self.backend.encode_batch(texts)
        budget = max(1, int(sum(len(t) for t in texts) * self.crosscheck_budget / 1_000_000))
        indices = select_sample(texts, budget, seed=len(texts))
        report = crosscheck(self.backend, self.tokenizer, self.dtype, texts, tokens, indices, names)
        self.checked["documents"] += report.documents
        self.checked["bytes"] += report.bytes
        return tokens

    def report(self) -> dict[str, Any]:
        if self.backend is None:
            return {"backend": "tokenizers", "backend_version": _tokenizers_version()}
        return {"backend": self.backend.name, "backend_version": self.backend.version,
                "crosscheck_documents": self.checked["documents"], "crosscheck_bytes": self.checked["bytes"]}


def _tokenizers_version() -> str:
    import tokenizers

    return str(tokenizers.__version__)
