"""`prep drill`: a load drill of the training input path without training. W ranks (separate
processes, as the ranks of a node are) read N steps of one source from the store through one
shared node-local cache, and the report says per rank how long the first batch took, what it
fetched, the cache's peak size and how long the consumer waited per step, plus the transfers
that happened more than once across ranks (prep.drill-report/1, manifests/drill-report-1.schema.json).
"""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prep.data.reader import Exhausted, Reader

SCHEMA = "prep.drill-report/1"
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class DrillConfig:
    """What to read and how: the source, store, world size, cache bound and reader settings."""

    source: str
    store: str | None
    world_size: int
    cache_bytes: int
    steps: int
    seq_len: int
    global_batch: int
    cache_dir: str | None = None
    seed: int = 0
    prefetch_steps: int | None = None
    jobs: int = 4


def percentile(values: list[float], q: int) -> float:
    """The nearest-rank q-th percentile of `values` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-q * len(ordered) // 100) - 1))]


def _reader(config: DrillConfig, rank: int, cache_dir: str) -> Reader:
    """Rank `rank`'s reader: through the shared cache unless the source is a pulled folder."""
    options: dict[str, Any] = {}
    if config.store is not None and not Path(config.source).is_dir():
        options = {"cache_dir": cache_dir, "cache_bytes": config.cache_bytes, "jobs": config.jobs,
                   "prefetch_steps": config.prefetch_steps}
    return Reader(config.source, seq_len=config.seq_len, global_batch_size=config.global_batch, rank=rank,
                  world_size=config.world_size, seed=config.seed, store=config.store, **options)


def run_rank(config: DrillConfig, rank: int, cache_dir: str) -> dict[str, Any]:
    """Read the steps as rank `rank` would; what it cost, and which objects it fetched how often."""
    started = time.perf_counter()
    waits: list[float] = []
    first = 0.0
    with _reader(config, rank, cache_dir) as reader:
        for step in range(config.steps):
            try:
                reader.batch(step)
            except Exhausted:
                break
            waits.append(reader.stats()["fetch_seconds_last_step"])
            if step == 0:
                first = time.perf_counter() - started
        wall = time.perf_counter() - started
        stats = reader.stats()
        fetched = {sha: [count, reader.cache.stats.sizes[sha]] for sha, count in reader.cache.stats.fetched.items()} \
            if reader.cache is not None else {}
    cache = stats.get("cache", {})
    after_first = sum(waits[1:])
    return {
        "rank": rank, "steps": len(waits), "first_batch_seconds": first, "wall_seconds": wall,
        "bytes_fetched": cache.get("bytes_fetched", 0), "bytes_refetched": cache.get("bytes_refetched", 0),
        "fetches": cache.get("fetches", 0), "hits": cache.get("hits", 0), "misses": cache.get("misses", 0),
        "peak_cache_bytes": cache.get("peak_cache_bytes", 0),
        "fetch_seconds": {"total": sum(waits), "after_first_batch": after_first,
                          **{f"p{q}": percentile(waits, q) for q in PERCENTILES}, "max": max(waits, default=0.0)},
        "fetch_share_after_first_batch": after_first / (wall - first) if wall > first else 0.0,
        "_fetched": fetched,
    }


def drill(config: DrillConfig) -> dict[str, Any]:
    """Run every rank at once, each in its own process, and build the prep.drill-report/1 report."""
    cache_dir = config.cache_dir or tempfile.mkdtemp(prefix="prep-drill-cache-")
    try:
        started = time.perf_counter()
        with ProcessPoolExecutor(config.world_size, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(run_rank, config, rank, cache_dir) for rank in range(config.world_size)]
            ranks = [future.result() for future in futures]
        wall = time.perf_counter() - started
    finally:
        if config.cache_dir is None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    counts: Counter[str] = Counter()
    by_rank: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    for rank in ranks:
        for sha, (count, size) in rank.pop("_fetched").items():
            counts[sha] += count
            by_rank[sha] += 1
            sizes[sha] = size
    return {
        "schema": SCHEMA, "settings": {k: v for k, v in asdict(config).items() if k != "cache_dir"},
        "ranks_run_as": "processes", "wall_seconds": wall, "ranks": ranks,
        "duplicates": {"fetches": sum(n - 1 for n in counts.values()),
                       "bytes": sum((n - 1) * sizes[sha] for sha, n in counts.items()),
                       "objects_fetched_by_several_ranks": sum(1 for n in by_rank.values() if n > 1)},
        "totals": {"bytes_fetched": sum(r["bytes_fetched"] for r in ranks), "distinct_objects_fetched": len(counts),
                   "peak_cache_bytes": max((r["peak_cache_bytes"] for r in ranks), default=0)},
    }
