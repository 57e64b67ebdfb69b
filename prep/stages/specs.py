"""Descriptions of stage work that the build driver makes and workers receive: plain values,
no heavy imports, so the driver stays light (numpy, Arrow and tokenizers load in workers only)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prep.config import DEFAULT_TOKENIZER_CACHE
from prep.hashing import pack_ids, unpack_ids
from prep.neardup.settings import NearDupSettings
from prep.steps import catalog
from prep.steps.protocol import DocumentStep


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
    order_seed: int | None = None  # lays documents out in this seed's key order (prep.workfiles.intermediate)
    tokenizer_cache: int = DEFAULT_TOKENIZER_CACHE  # [build] tokenizer_cache: when a worker reloads its engine
    steps: tuple[DocumentStep, ...] = ()  # [[steps]]: run on each document before it is tokenized
    metadata_keys: tuple[str, ...] = ()  # Pipeline.metadata_keys: what each document's metadata may hold
    near: NearDupSettings | None = None  # [dedup.near]: each task writes its part's band hashes too
    exclude: str | None = None  # [input] exclude: the object id of the exclusion table (prep.inputs.exclusions)

    def key_fields(self) -> dict[str, object]:
        """The settings that change a task's output (the backend and the cache bound never do); the
        document steps' kinds, code and settings, the metadata keys, the near-duplicate settings and
        the exclusion table (so a changed deletion request re-tokenizes), only when some are configured."""
        steps: dict[str, object] = {"steps": catalog.key_fields(self.steps)} if self.steps else {}
        metadata: dict[str, object] = {"metadata_keys": list(self.metadata_keys)} if self.metadata_keys else {}
        near: dict[str, object] = {"near": self.near.key_fields()} if self.near is not None else {}
        exclude: dict[str, object] = {"exclude": self.exclude} if self.exclude is not None else {}
        return {"tokenizer": self.tokenizer_sha256, "eos": self.eos,
                "encode_special_tokens": self.encode_special_tokens, "on_error": self.on_error,
                "order_seed": self.order_seed, **steps, **metadata, **near, **exclude}


@dataclass(frozen=True)
class Part:
    """One committed tokenize task's intermediate, as later stages see it."""

    path: Path
    source: str
    format: str
    line_offset: int
    documents: int


@dataclass(frozen=True)
class PartTable:
    """What an order task needs of every part, packed (40 bytes a part, where the tokenize stage
    manifest takes hundreds): the SHA-256 of its source, which names the source in leaf digests,
    and its line offset, both in input order. The driver makes it, so no order task parses the
    stage manifest, whose size follows the corpus."""

    source_digests: bytes  # 32 bytes a part
    line_offsets: bytes  # little-endian int64 a part

    @classmethod
    def of(cls, parts: Sequence[tuple[str, int]]) -> PartTable:
        """The table of (source, line offset) pairs, in input order."""
        digests = b"".join(hashlib.sha256(source.encode("utf-8", "surrogatepass")).digest() for source, _ in parts)
        return cls(digests, struct.pack(f"<{len(parts)}q", *(offset for _, offset in parts)))

    def __len__(self) -> int:
        return len(self.line_offsets) // 8

    def to_bytes(self) -> bytes:
        """The table as one object's bytes: the digests, then the offsets."""
        return self.source_digests + self.line_offsets

    @classmethod
    def from_bytes(cls, data: bytes) -> PartTable:
        """The table `to_bytes` gave; ValueError for bytes of no table's length."""
        if len(data) % 40:
            raise ValueError(f"a part table of {len(data)} bytes (40 a part)")
        count = len(data) // 40
        return cls(data[:32 * count], data[32 * count:])


@dataclass(frozen=True)
class ShardParts:
    """What a shard job needs of every part, packed (44 bytes a part, plus each source once):
    its intermediate's SHA-256 (raw), its line offset, and its source as an index into
    `sources`. A tuple of PartRefs took hundreds of bytes a part in every job, and a window's
    `.json` members need only the sources its own documents name."""

    intermediates: bytes  # 32 bytes a part
    line_offsets: bytes  # little-endian int64 a part
    source_of: bytes  # little-endian uint32 a part: its index in `sources`
    sources: tuple[str, ...]  # each source once, in order of first use

    @classmethod
    def of(cls, parts: Sequence[tuple[str, str, int]]) -> ShardParts:
        """The table of (intermediate object id, source, line offset) triples, in input order."""
        numbered: dict[str, int] = {}
        source_of = [numbered.setdefault(source, len(numbered)) for _, source, _ in parts]
        return cls(pack_ids([object_id for object_id, _, _ in parts]),
                   struct.pack(f"<{len(parts)}q", *(offset for _, _, offset in parts)),
                   struct.pack(f"<{len(parts)}I", *source_of), tuple(numbered))

    def __len__(self) -> int:
        return len(self.line_offsets) // 8

    def to_bytes(self) -> bytes:
        """The table as one object's bytes: part and source counts, the three columns, then each
        source as its UTF-8 length and bytes."""
        names = [source.encode("utf-8", "surrogatepass") for source in self.sources]
        return b"".join([struct.pack("<QQ", len(self), len(names)), self.intermediates, self.line_offsets,
                         self.source_of, *(struct.pack("<I", len(name)) + name for name in names)])

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardParts:
        """The table `to_bytes` gave; ValueError for bytes that are not one."""
        try:
            count, named = struct.unpack_from("<QQ", data)
            at = 16 + 44 * count
            columns = data[16:16 + 32 * count], data[16 + 32 * count:16 + 40 * count], data[16 + 40 * count:at]
            sources = []
            for _ in range(named):
                (length,) = struct.unpack_from("<I", data, at)
                sources.append(data[at + 4:at + 4 + length].decode("utf-8", "surrogatepass"))
                at += 4 + length
        except (struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"not a shard parts table ({exc})") from None
        if at != len(data) or len(columns[2]) != 4 * count:
            raise ValueError(f"a shard parts table of {len(data)} bytes does not hold what its header counts")
        return cls(*columns, tuple(sources))

    def object_ids(self) -> list[str]:
        """Every part's intermediate object id, in input order."""
        return unpack_ids(self.intermediates)


def entries_path(intermediate: Path) -> Path:
    """Where a tokenize task writes its part's entries: beside its intermediate at `intermediate`."""
    return intermediate.with_name(intermediate.name + ".entries")


def bands_path(intermediate: Path) -> Path:
    """Where a tokenize task writes its part's band hashes (with [dedup.near]): beside its intermediate."""
    return intermediate.with_name(intermediate.name + ".bands")


def outcomes_path(intermediate: Path, step: int) -> Path:
    """Where a tokenize task writes the outcomes of its part's step number `step` (0-based;
    prep.workfiles.outcomes): beside its intermediate."""
    return intermediate.with_name(f"{intermediate.name}.step{step}")


def staged_paths(intermediate: Path, steps: int) -> list[Path]:
    """Every file a tokenize task writing `intermediate` with `steps` document steps may leave staged."""
    return [intermediate, entries_path(intermediate), bands_path(intermediate),
            *(outcomes_path(intermediate, index) for index in range(steps))]
