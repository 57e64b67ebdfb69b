"""Benchmark (not a test): `prep fsck` against parallel `sha256sum` and `openssl dgst` over the same objects.

    python -m tests.bench.bench_fsck [--total-mb 768] [--shards 32] [--jobs N] [--repeat 3]

Builds the sample pipeline for real (its stage manifests and intermediates), then publishes a
snapshot on those stages with --total-mb of shard-like random artifacts (tests/snapshot_factory),
warms the page cache, and times `prep fsck --jobs N` and parallel `sha256sum` and `openssl dgst
-sha256` of every object file from the command line (interpreter start-up included), interleaved, best of --repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prep.storage.local import LocalStore
from prep.store.layout import object_key, snapshot_marker_key
from prep.store.refs import move_ref
from prep.store.snapshots import publish_manifest, resolve
from tests.bench.bench_verify import bin_size_for, warm
from tests.snapshot_factory import build_snapshot

PREP = [sys.executable, "-m", "prep.cli.main"]


def big_snapshot(root: Path, total_mb: int, shards: int) -> LocalStore:
    """A store holding the sample build and bench@latest: its stages, and `total_mb` of artifacts."""
    store = LocalStore(root / "store")
    subprocess.run([*PREP, "sample", "sample"], check=True, capture_output=True, cwd=root)
    pipeline = root / "sample.toml"
    subprocess.run([*PREP, "build", str(pipeline), "--store", str(store.root)], check=True, capture_output=True)
    stages = resolve(store, next(ref.key for ref in store.list("refs/")).split("/")[1] + "@latest").manifest["stages"]
    built = build_snapshot(store, root / "work", dataset="bench", ref=None,
                           shard_sizes=[bin_size_for(total_mb * 10**6, shards)] * shards)
    shutil.rmtree(root / "work")
    store.delete(snapshot_marker_key(built.snapshot.id))  # the factory's own manifest names no real stages
    store.delete(object_key(built.snapshot.id.removeprefix("sha256:")))
    snapshot = publish_manifest(store, {**built.snapshot.manifest, "stages": stages})
    move_ref(store, "bench", "latest", snapshot.id)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mb", type=int, default=768)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a temporary folder, removed after.")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="prep-bench-fsck-", dir=args.workdir))
    try:
        store = big_snapshot(root, args.total_mb, args.shards)
        objects = sorted(p for p in (store.root / "objects").rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in objects)
        print(f"store: {len(objects)} objects, {total / 1e9:.3f} GB; jobs {args.jobs}; best of {args.repeat}; "
              f"{os.cpu_count()} CPUs", flush=True)
        warm(objects)
        fsck_cmd = [*PREP, "fsck", "--store", str(store.root), "--jobs", str(args.jobs), "--json"]
        tools = {f"find | xargs -P {args.jobs} sha256sum": "sha256sum",
                 f"find | xargs -P {args.jobs} openssl dgst -sha256": "openssl dgst -sha256"}
        times: dict[str, list[float]] = {"prep fsck (CLI)": [], **{name: [] for name in tools}}
        for _ in range(args.repeat):  # interleaved so all see the same machine load
            started = time.perf_counter()
            report = json.loads(subprocess.run(fsck_cmd, check=True, capture_output=True).stdout)
            times["prep fsck (CLI)"].append(time.perf_counter() - started)
            assert report["clean"] and report["checked"]["bytes"] == total, report["summary"]
            for name, tool in tools.items():
                started = time.perf_counter()
                subprocess.run(["sh", "-c", f"find {store.root}/objects -type f -print0 | "
                                f"xargs -0 -P {args.jobs} -n 16 {tool} > /dev/null"], check=True)
                times[name].append(time.perf_counter() - started)
        best = {name: min(values) for name, values in times.items()}
        for name, seconds in best.items():
            print(f"{name:<44} {seconds:7.3f} s  {total / 1e9 / seconds:6.2f} GB/s")
        for name in tools:
            print(f"speed ratio prep fsck / {tools[name]}: "
                  f"{best[name] / best['prep fsck (CLI)']:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
