"""The node-local cache's values: its options, what it did for one reader, and a pinned file's hold
(prep.data.cache decides with them)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prep.data.pread import TokenFile
from prep.errors import UsageError
from prep.transfer.verify import DEFAULT_JOBS

LEADS_KEPT = 4096  # prefetch leads the median is taken over: the latest ones, so a long run's memory stays flat


def whole(name: str, value: object, low: int = 1, high: int | None = None) -> int:
    """`value` as an int in [low, high) (numpy integers too), else a UsageError naming it: a
    setting of 1.5 or "3" would fail mid-run, and a seed of 2**64 would read as seed 0 does (the
    permutation keeps 64 bits), as the state file's schema and the mixture file refuse them."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    number = int(value)
    if number < low or (high is not None and number >= high):
        bounds = f"in [{low}, 2**64)" if high == 2**64 else f">= {low}"
        raise UsageError(f"{name} must be an integer {bounds}, got {number}")
    return number


@dataclass(frozen=True)
class CacheOptions:
    """Where the cache lives, its bound, how far ahead it prefetches and with how many fetches."""

    cache_dir: Path
    cache_bytes: int
    prefetch_steps: int | None = None
    prefetch_bytes: int | None = None
    jobs: int = min(DEFAULT_JOBS, 4)
    policy: str = "belady"
    horizon: int = 256

    def __post_init__(self) -> None:
        """Refuse now, naming it, an option that would fail mid-run or be bent silently (a size
        given as "1GB", a negative lookahead)."""
        whole("cache_bytes", self.cache_bytes)
        for name in ("prefetch_steps", "prefetch_bytes"):
            if getattr(self, name) is not None:
                whole(name, getattr(self, name), 0)
        whole("jobs", self.jobs)
        whole("horizon", self.horizon)


@dataclass
class CacheStats:
    """What the cache did for one reader: hits, misses, bytes fetched (twice), peak, prefetch lead."""

    hits: int = 0
    misses: int = 0
    fetches: int = 0
    bytes_fetched: int = 0
    bytes_refetched: int = 0
    evictions: int = 0
    peak_bytes: int = 0
    leads: deque[float] = field(default_factory=lambda: deque(maxlen=LEADS_KEPT))  # the latest leads
    lead_min: float | None = None  # over the whole run
    fetched: Counter[str] = field(default_factory=Counter)  # fetches per object sha256
    sizes: dict[str, int] = field(default_factory=dict)  # object sizes by sha256

    def count_fetch(self, sha256: str, size: int) -> None:
        """One object fetched (again, if it was fetched before)."""
        self.fetches += 1
        self.bytes_fetched += size
        self.bytes_refetched += size if sha256 in self.fetched else 0
        self.fetched[sha256] += 1
        self.sizes[sha256] = size

    def add_lead(self, seconds: float) -> None:
        """How long before its first use a prefetched object was ready."""
        self.leads.append(seconds)
        self.lead_min = seconds if self.lead_min is None else min(self.lead_min, seconds)

    def to_json(self) -> dict[str, Any]:
        leads = sorted(self.leads)
        return {"hits": self.hits, "misses": self.misses, "fetches": self.fetches,
                "bytes_fetched": self.bytes_fetched, "bytes_refetched": self.bytes_refetched,
                "evictions": self.evictions, "peak_cache_bytes": self.peak_bytes,
                "prefetch_lead_seconds_min": self.lead_min,
                "prefetch_lead_seconds_median": leads[len(leads) // 2] if leads else None}


@dataclass
class Hold:
    """A pinned cache file: its lock descriptor (flocked shared), the file held open for reading, its path."""

    fd: int
    file: TokenFile
    path: Path
    refs: int = 0
    closing: bool = False  # dropped by close() while in use: closed at its last release
