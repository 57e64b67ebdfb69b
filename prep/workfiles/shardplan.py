"""A shard as the stage manifests record it before it is written, which history reads back.

ShardPlan (layouts 2 and 3: a key range and its bucket slices, in the shard stage manifest; cut by
prep.stages.cuts) and ShardSpec (layout 1: a run of shuffled positions, in the shuffle stage
manifest). Plain values with no heavy imports: the build driver makes ShardPlans."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ShardPlan:
    """One shard: its key range (start, depth), where its documents are (bucket, first, count)
    slices in key order, its totals and the digest of everything its bytes depend on."""

    index: int
    start: int
    depth: int
    slices: tuple[tuple[int, int, int], ...]
    documents: int
    tokens: int
    bin_size: int
    text_bytes: int
    digest: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        """The shard's artifact name: its range start, 16 hex digits (sorts in key order)."""
        return f"{self.start:016x}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "depth": self.depth,
                "slices": [list(s) for s in self.slices], "documents": self.documents, "tokens": self.tokens,
                "bin_size": self.bin_size, "text_bytes": self.text_bytes, "digest": self.digest}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardPlan:
        return cls(int(data["index"]), int(data["name"], 16), int(data["depth"]),
                   tuple((int(b), int(f), int(c)) for b, f, c in data["slices"]), int(data["documents"]),
                   int(data["tokens"]), int(data["bin_size"]), int(data["text_bytes"]), str(data["digest"]))


@dataclass(frozen=True)
class ShardSpec:
    """Everything about one output shard that is known before it is written (layout 1)."""

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
