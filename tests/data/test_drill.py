"""prep.data.drill: rank processes reading from moto's S3 through one shared cache, and what the
report says about them (validated against manifests/drill-report-1.schema.json)."""

from __future__ import annotations

from pathlib import Path

from prep.data.drill import DrillConfig, drill, percentile
from prep.manifest.schema import validate
from prep.storage import open_store
from tests.s3support import new_bucket
from tests.snapshot_factory import build_snapshot

SHARD = 20_000


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) == 0.0


def test_two_ranks_share_one_cache_and_fetch_each_shard_once(s3_endpoint: str, tmp_path: Path) -> None:
    url = f"{new_bucket()}/datasets"
    built = build_snapshot(open_store(url), tmp_path / "work", shard_sizes=(SHARD,) * 6, formats=("bin",))
    config = DrillConfig("demo@latest", url, world_size=2, cache_bytes=6 * SHARD, steps=8, seq_len=128,
                         global_batch=16, cache_dir=str(tmp_path / "cache"))
    report = drill(config)
    validate(report, "prep.drill-report/1", "drill report")
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and {r["steps"] for r in report["ranks"]} == {8}
    assert report["totals"]["distinct_objects_fetched"] == len(built.snapshot.artifacts)
    assert report["totals"]["bytes_fetched"] == 6 * SHARD
    assert report["duplicates"] == {"fetches": 0, "bytes": 0, "objects_fetched_by_several_ranks": 0}
    for rank in report["ranks"]:
        assert 0 < rank["first_batch_seconds"] <= rank["wall_seconds"]
        waits = rank["fetch_seconds"]
        assert waits["p50"] <= waits["p90"] <= waits["p99"] <= waits["max"] <= waits["total"]
        assert rank["peak_cache_bytes"] <= 6 * SHARD


def test_a_small_cache_shows_refetches_and_stays_within_its_bound(s3_endpoint: str, tmp_path: Path) -> None:
    url = f"{new_bucket()}/datasets"
    build_snapshot(open_store(url), tmp_path / "work", shard_sizes=(SHARD,) * 6, formats=("bin",))
    report = drill(DrillConfig("demo@latest", url, world_size=2, cache_bytes=2 * SHARD, steps=6, seq_len=128,
                               global_batch=32, prefetch_steps=1))
    validate(report, "prep.drill-report/1", "drill report")
    assert report["totals"]["peak_cache_bytes"] <= 2 * SHARD
    assert report["duplicates"]["fetches"] > 0
    assert report["duplicates"]["bytes"] == report["duplicates"]["fetches"] * SHARD
    assert report["totals"]["bytes_fetched"] == sum(r["bytes_fetched"] for r in report["ranks"])
    assert not list(Path("/tmp").glob("prep-drill-cache-*/users/*.json"))  # the temporary cache is gone
