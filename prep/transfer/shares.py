"""Rank shares: a deterministic, byte-balanced partition of a snapshot's artifacts.

Every node computes the same partition from the manifest alone. A Megatron `.bin` and its
`.idx` always land on the same rank, because one is useless without the other.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prep.errors import UsageError
from prep.formats.units import family_of


@dataclass(frozen=True)
class Artifact:
    """One file of a snapshot: where it goes under DEST and what its bytes must be."""

    path: str
    format: str
    shard: int
    size: int
    sha256: str

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any]) -> Artifact:
        return cls(
            path=str(entry["path"]),
            format=str(entry["format"]),
            shard=int(entry["shard"]),
            size=int(entry["size"]),
            sha256=str(entry["sha256"]),
        )


@dataclass(frozen=True)
class Unit:
    """Artifacts that must stay on one rank: one shard of one format family."""

    shard: int
    family: str
    artifacts: tuple[Artifact, ...]

    @property
    def size(self) -> int:
        return sum(artifact.size for artifact in self.artifacts)

    @property
    def sort_key(self) -> tuple[int, int, str, str]:
        """Largest first; ties broken by shard, family and first path so every node agrees."""
        return (-self.size, self.shard, self.family, self.artifacts[0].path)


@dataclass(frozen=True)
class Share:
    """What one rank of `world_size` holds."""

    rank: int
    world_size: int
    artifacts: tuple[Artifact, ...]

    @property
    def size(self) -> int:
        return sum(artifact.size for artifact in self.artifacts)


def artifacts_of(manifest: Mapping[str, Any]) -> list[Artifact]:
    """The artifacts a snapshot manifest lists, in manifest order."""
    return [Artifact.from_manifest(entry) for entry in manifest["artifacts"]]


def group_units(artifacts: Iterable[Artifact]) -> list[Unit]:
    """Group artifacts into units (shard, format family: prep.formats.units), members sorted by path."""
    members: dict[tuple[int, str], list[Artifact]] = {}
    for artifact in artifacts:
        members.setdefault((artifact.shard, family_of(artifact.format)), []).append(artifact)
    return [
        Unit(shard=shard, family=family, artifacts=tuple(sorted(group, key=lambda a: a.path)))
        for (shard, family), group in members.items()
    ]


def check_rank(rank: int, world_size: int) -> None:
    """Reject a rank outside 0..world_size-1 or a world size below 1."""
    if world_size < 1:
        raise UsageError(f"--world-size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise UsageError(f"--rank must be between 0 and {world_size - 1}, got {rank}")


def partition(artifacts: Sequence[Artifact], world_size: int) -> list[Share]:
    """Split artifacts into `world_size` shares: units go largest first to the least-loaded
    rank (lowest rank on ties), so max load <= total/world_size + largest unit."""
    check_rank(0, world_size)
    loads: list[tuple[int, int]] = [(0, rank) for rank in range(world_size)]
    assigned: list[list[Artifact]] = [[] for _ in range(world_size)]
    for unit in sorted(group_units(artifacts), key=lambda u: u.sort_key):
        load, rank = heapq.heappop(loads)
        assigned[rank].extend(unit.artifacts)
        heapq.heappush(loads, (load + unit.size, rank))
    return [
        Share(rank=rank, world_size=world_size, artifacts=tuple(sorted(items, key=lambda a: a.path)))
        for rank, items in enumerate(assigned)
    ]


def share_of(artifacts: Sequence[Artifact], rank: int | None, world_size: int | None) -> Share:
    """The share of `rank`; with no rank and world size, everything as one share."""
    if rank is None and world_size is None:
        return Share(rank=0, world_size=1, artifacts=tuple(sorted(artifacts, key=lambda a: a.path)))
    if rank is None or world_size is None:
        raise UsageError("--rank and --world-size must be given together")
    check_rank(rank, world_size)
    return partition(artifacts, world_size)[rank]
