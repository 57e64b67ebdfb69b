"""Benchmark (not a test): `prep verify` vs parallel `openssl dgst`, `prep pull` vs `cp -r`.

    python -m tests.bench.bench_verify [--total-mb 768] [--shards 32] [--jobs N] [--repeat 3]

Builds a snapshot of shard-like random files (per shard a .bin, a small .idx and a .tar),
warms the page cache, then times each tool from the command line (interpreter start-up
included) with the same parallelism. Reports the best of --repeat runs of each, interleaved.
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
from dataclasses import dataclass
from pathlib import Path

from prep.storage.local import LocalStore
from tests.bench.benchsupport import best_of
from tests.snapshot_factory import build_snapshot

PREP = [sys.executable, "-m", "prep.cli.main"]


@dataclass(frozen=True)
class Timing:
    name: str
    seconds: float
    data_bytes: int

    @property
    def gb_per_s(self) -> float:
        return self.data_bytes / 1e9 / self.seconds


def bin_size_for(total_bytes: int, shards: int) -> int:
    """The factory writes per shard a .bin of S, an .idx of ~S/50 and a .tar of ~S/2 bytes."""
    return int(total_bytes / shards / (1 + 1 / 50 + 1 / 2))


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(command, check=True, stdout=subprocess.PIPE, **kwargs)  # type: ignore[call-overload, no-any-return]


def warm(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "rb") as handle:
            while handle.read(8 << 20):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mb", type=int, default=768, help="Approximate snapshot size (>= 600).")
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="Parallelism of verify and openssl.")
    parser.add_argument("--pull-jobs", type=int, default=8, help="prep pull --jobs (its default).")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a temporary folder, removed after.")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="prep-bench-", dir=args.workdir))
    try:
        store = LocalStore(root / "store")
        bin_size = bin_size_for(args.total_mb * 10**6, args.shards)
        built = build_snapshot(store, root / "work", shard_sizes=[bin_size] * args.shards)
        shutil.rmtree(root / "work")
        total = sum(len(data) for data in built.files.values())
        del built
        objects = sorted(p for p in (store.root / "objects").rglob("*") if p.is_file())
        print(f"snapshot: {len(objects) - 1} artifacts, {total / 1e9:.3f} GB, {args.shards} shards; "
              f"verify jobs {args.jobs}; best of {args.repeat}; {os.cpu_count()} CPUs", flush=True)
        warm(objects)

        pulled, copied = root / "pulled", root / "copied"
        env = dict(os.environ, PREP_STORE=str(store.root))
        pull_cmd = [*PREP, "pull", "demo@latest", str(pulled), "--jobs", str(args.pull_jobs)]
        pull_s = best_of(args.repeat, prepare=lambda: shutil.rmtree(pulled, ignore_errors=True),
                         action=lambda: run(pull_cmd, env=env, stderr=subprocess.DEVNULL))
        cp_s = best_of(args.repeat, prepare=lambda: shutil.rmtree(copied, ignore_errors=True),
                       action=lambda: run(["cp", "-r", str(store.root / "objects"), str(copied)]))
        cp_sync_s = best_of(args.repeat, prepare=lambda: shutil.rmtree(copied, ignore_errors=True),
                            action=lambda: (run(["cp", "-r", str(store.root / "objects"), str(copied)]),
                                     run(["sync", "-f", str(copied)])))
        artifacts = sorted(p for p in pulled.rglob("*") if p.is_file() and ".prep" not in p.parts)
        warm(artifacts)

        verify_cmd = [*PREP, "verify", str(pulled / ".prep/manifest.json"), str(pulled), "--jobs", str(args.jobs)]
        find_xargs = (f"find {pulled}/bin {pulled}/wds -type f | "
                      f"xargs -P {args.jobs} -n 1 openssl dgst -sha256 > /dev/null")
        verify_times, openssl_times, inner = [], [], []
        for _ in range(args.repeat):  # interleaved so both see the same machine load
            started = time.perf_counter()
            report = json.loads(run([*verify_cmd, "--json"]).stdout)
            verify_times.append(time.perf_counter() - started)
            inner.append(report["seconds"])
            assert report["ok"], report["problems"]
            started = time.perf_counter()
            run(["sh", "-c", find_xargs])
            openssl_times.append(time.perf_counter() - started)

        rows = [
            Timing("prep verify (CLI)", min(verify_times), total),
            Timing("  of which hashing", min(inner), total),
            Timing(f"find | xargs -P {args.jobs} -n 1 openssl dgst -sha256", min(openssl_times), total),
            Timing(f"prep pull --jobs {args.pull_jobs} (CLI, fsyncs)", pull_s, total),
            Timing("cp -r", cp_s, total),
            Timing("cp -r + sync -f", cp_sync_s, total),
        ]
        for row in rows:
            print(f"{row.name:<48} {row.seconds:7.3f} s  {row.gb_per_s:6.2f} GB/s")
        print(f"speed ratio prep verify / openssl: {min(openssl_times) / min(verify_times):.2f}")
        print(f"speed ratio prep pull / cp -r:     {cp_s / pull_s:.2f}  (/ cp -r + sync: {cp_sync_s / pull_s:.2f})")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
