"""Descriptions of stage work that the build driver makes and workers receive: plain values,
no heavy imports, so the driver stays light (numpy, Arrow and tokenizers load in workers only)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prep.config import DEFAULT_TOKENIZER_CACHE


@dataclass(frozen=True)
class TokenizeSettings:
    """Everything a tokenize task needs besides its input; `tokenizer_sha256` pins the file."""

    tokenizer_path: str
    tokenizer_sha256: str
    eos: str
    encode_special_tokens: bool
    backend: str
    on_error: str
    threads: int = 1
    order_seed: int | None = None  # lays documents out in this seed's key order (prep.stages.intermediate)
    tokenizer_cache: int = DEFAULT_TOKENIZER_CACHE  # [build] tokenizer_cache: when a worker reloads its engine

    def key_fields(self) -> dict[str, object]:
        """The settings that change a task's output (the backend and the cache bound never do)."""
        return {"tokenizer": self.tokenizer_sha256, "eos": self.eos,
                "encode_special_tokens": self.encode_special_tokens, "on_error": self.on_error,
                "order_seed": self.order_seed}


@dataclass(frozen=True)
class Part:
    """One committed tokenize task's intermediate, as later stages see it."""

    path: Path
    source: str
    format: str
    line_offset: int
    documents: int


@dataclass(frozen=True)
class ShardSpec:
    """Everything about one output shard that is known before it is written."""

    index: int
    first_pos: int
    documents: int
    tokens: int
    bin_size: int
    tar_size: int

    def to_json(self) -> dict[str, int]:
        return {"index": self.index, "first_pos": self.first_pos, "documents": self.documents,
                "tokens": self.tokens, "bin_size": self.bin_size, "tar_size": self.tar_size}

    @classmethod
    def from_json(cls, data: dict[str, int]) -> ShardSpec:
        return cls(**data)


def entries_path(intermediate: Path) -> Path:
    """Where a tokenize task writes its part's entries: beside its intermediate at `intermediate`."""
    return intermediate.with_name(intermediate.name + ".entries")
