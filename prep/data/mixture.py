"""Mixtures of snapshots: which source each global sample comes from, as a pure function.

The schedule repeats a block of BLOCK samples in which each source has its share of the weights
(largest remainders, so the counts add up to BLOCK), interleaved smoothly: a source's j-th sample
of the block is due at (j + 0.5) / its count, and the block takes samples in order of due time. So any BLOCK consecutive
samples hold each source within a few samples of its weight, and the source-local index of
global sample k is one multiplication and a table lookup: no O(samples) state.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import ConfigError
from prep.manifest import canonical

BLOCK = 10_000
_SOURCE_KEYS = {"snapshot", "weight", "max_epochs"}


@dataclass(frozen=True)
class SourceSpec:
    """One `[[source]]` of a mixture file (or the single source of a plain reader)."""

    snapshot: str
    weight: float = 1.0
    max_epochs: int | None = None


@dataclass(frozen=True)
class MixtureSpec:
    """A parsed mixture file: its seed and sources, in file order."""

    seed: int
    sources: tuple[SourceSpec, ...]


def parse_mixture(path: Path) -> MixtureSpec:
    """Read a mixture TOML file; every mistake is a ConfigError naming the file and key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: mixture file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read mixture file: {exc}") from None
    unknown = sorted(set(data) - {"seed", "source"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown key")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ConfigError(f"{path}: seed: expected an integer in [0, 2**64), got {seed!r}")
    entries = data.get("source")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: source: at least one [[source]] table is required")
    sources = tuple(_source(path, index, entry) for index, entry in enumerate(entries))
    if sum(source.weight for source in sources) <= 0:
        raise ConfigError(f"{path}: source.weight: the weights must sum to a positive number")
    return MixtureSpec(seed, sources)


def _source(path: Path, index: int, entry: Any) -> SourceSpec:
    where = f"{path}: source[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a table")
    unknown = sorted(set(entry) - _SOURCE_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key")
    snapshot, weight, max_epochs = entry.get("snapshot"), entry.get("weight", 1.0), entry.get("max_epochs")
    if not isinstance(snapshot, str) or not snapshot:
        raise ConfigError(f"{where}.snapshot: expected a snapshot spec such as web@latest or sha256:...")
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not _finite(weight) or weight < 0:
        raise ConfigError(f"{where}.weight: expected a finite number >= 0, got {weight!r}")
    if max_epochs is not None and (isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1):
        raise ConfigError(f"{where}.max_epochs: expected a whole number >= 1, got {max_epochs!r}")
    return SourceSpec(snapshot, float(weight), max_epochs)


def _finite(number: int | float) -> bool:
    """True when `number` is a finite float, or an int a float can hold (10**400 cannot)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def mixture_hash(seed: int, sources: list[tuple[str, float, int | None]]) -> str:
    """The identity of a resolved mixture: its seed and each source's snapshot id, weight, cap."""
    body = canonical.dumps({"seed": seed, "sources": [{"snapshot": s, "weight": repr(w), "max_epochs": m}
                                                      for s, w, m in sources]})
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Schedule:
    """Global sample k -> (its source, its index among that source's samples), for fixed weights."""

    def __init__(self, weights: list[float]) -> None:
        values, total = np.asarray(weights, dtype=np.float64), float(sum(weights))
        if not math.isfinite(total):  # weights near the float maximum; finite sums keep this exact arithmetic
            values = values / max(weights)
            total = float(sum(values.tolist()))
        shares = values / total
        counts = np.floor(shares * BLOCK).astype(np.int64)
        order = np.argsort(-(shares * BLOCK - counts), kind="stable")
        counts[order[:BLOCK - int(counts.sum())]] += 1
        self.counts = counts
        # Source s's j-th sample of the block is due at (j + 0.5) / counts[s]; sorting every
        # sample by that time (ties by source) interleaves the sources smoothly.
        source = np.repeat(np.arange(len(weights), dtype=np.int32), counts)
        rank = np.concatenate([np.arange(n, dtype=np.int64) for n in counts.tolist()])
        due = (rank + 0.5) / counts[source]
        order = np.lexsort((source, due))
        self.source, self.rank = source[order], rank[order]

    def place(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For global sample indices, their source and index among that source's samples."""
        block, offset = np.divmod(np.asarray(samples, dtype=np.int64), BLOCK)
        source = self.source[offset]
        return source, block * self.counts[source] + self.rank[offset]
