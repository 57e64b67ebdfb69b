"""The node-local cache's values: its options, what it did for one reader, and a pinned file's hold
(prep.data.cache decides with them)."""

from __future__ import annotations

import mmap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prep.transfer.verify import DEFAULT_JOBS


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
    leads: list[float] = field(default_factory=list)
    fetched: Counter[str] = field(default_factory=Counter)  # fetches per object sha256
    sizes: dict[str, int] = field(default_factory=dict)  # object sizes by sha256

    def to_json(self) -> dict[str, Any]:
        leads = sorted(self.leads)
        return {"hits": self.hits, "misses": self.misses, "fetches": self.fetches,
                "bytes_fetched": self.bytes_fetched, "bytes_refetched": self.bytes_refetched,
                "evictions": self.evictions, "peak_cache_bytes": self.peak_bytes,
                "prefetch_lead_seconds_min": leads[0] if leads else None,
                "prefetch_lead_seconds_median": leads[len(leads) // 2] if leads else None}


@dataclass
class Hold:
    """A pinned, mapped cache file: its lock descriptor (flocked shared), its bytes, its path."""

    fd: int
    data: mmap.mmap | bytes
    path: Path
    refs: int = 0
    _view: np.ndarray | None = None

    def view(self, dtype: np.dtype[Any]) -> np.ndarray:
        """The bytes as a read-only array of `dtype`, made once per hold (callers must not keep it)."""
        if self._view is None or self._view.dtype != dtype:
            self._view = np.frombuffer(self.data, dtype=dtype)
        return self._view
