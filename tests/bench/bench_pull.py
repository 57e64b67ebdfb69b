"""Benchmark (not a test): `prep pull` against `cp` of the same objects plus `openssl dgst -sha256`
over the copies, with the same parallelism, measured side by side in one run.

    python -m tests.bench.bench_pull [--total-mb 3072] [--shards 24] [--jobs 8] [--repeat 3] [--s3]

Builds a local store with a snapshot of shard-like random files (per shard a .bin, a small .idx
and a .tar), warms the page cache with the objects (it cannot be dropped here: every source read
is a cached read, for every tool alike), then times, interleaved, best of --repeat:

* `prep pull --jobs J` from the command line (copies, hashes, fsyncs each file, renames);
* `xargs -P J cp` of the objects, then `xargs -P J openssl dgst -sha256` over the copies (the
  copies are still in the page cache when hashed), and the same plus `sync -f` (pull fsyncs);

and prints the ratio pull / (cp + hash). With --s3, also a pull from a moto S3 server over
loopback HTTP (one shot) against `cp + hash` of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prep.storage.local import LocalStore
from tests.bench.bench_verify import bin_size_for, run, warm
from tests.snapshot_factory import build_snapshot

PREP = [sys.executable, "-m", "prep.cli.main"]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def xargs(jobs: int, listing: Path, command: str) -> list[str]:
    """`xargs -P jobs` running `command` (sh, file as $0) once per path in `listing`."""
    return ["sh", "-c", f"xargs -P {jobs} -n 1 sh -c '{command}' < {listing}"]


def s3_pull(root: Path, store: LocalStore, jobs: int, limit_mb: int) -> None:
    """Pull from a moto S3 server over loopback HTTP holding a snapshot of up to `limit_mb`."""
    from moto.server import ThreadedMotoServer

    from prep.storage import open_store
    from prep.transfer import fetch
    from prep.transfer.pull import pull
    from tests.s3support import new_bucket, s3_env

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        os.environ.update(s3_env(f"http://{host}:{port}"))
        remote = open_store(f"{new_bucket()}/bench")
        shards = max(1, limit_mb // 64)
        built = build_snapshot(remote, root / "s3-work", shard_sizes=[bin_size_for(limit_mb * 10**6, shards)] * shards)
        total = sum(len(data) for data in built.files.values())
        print(f"moto S3 over loopback HTTP, {total / 1e9:.2f} GB, {shards} shards, pull --jobs {jobs}, in-process:")
        parallel, dest = fetch.RANGE_JOBS, root / "s3-pulled"
        for ranges in (1, parallel, 1, parallel):  # interleaved
            fetch.RANGE_JOBS = ranges
            shutil.rmtree(dest, ignore_errors=True)
            seconds = timed(lambda: pull(remote, built.snapshot, dest, jobs=jobs))
            print(f"  {ranges} range GET(s) in flight per large object {seconds:7.3f} s  {total / 1e9 / seconds:6.2f} GB/s")
        fetch.RANGE_JOBS = parallel
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-mb", type=int, default=3072, help="Approximate snapshot size.")
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=8, help="prep pull --jobs and xargs -P.")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/work/tmp"), help="Where the store and copies go.")
    parser.add_argument("--compare-with", type=Path, default=None,
                        help="Also time `prep pull` of another source tree (PYTHONPATH), e.g. an older commit.")
    parser.add_argument("--s3", action="store_true", help="Also pull once from a moto S3 server.")
    parser.add_argument("--s3-mb", type=int, default=512, help="Size of the snapshot in the moto server (memory).")
    args = parser.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="prep-bench-pull-", dir=args.workdir))
    try:
        store = LocalStore(root / "store")
        built = build_snapshot(store, root / "work", shard_sizes=[bin_size_for(args.total_mb * 10**6, args.shards)]
                               * args.shards)
        shutil.rmtree(root / "work")
        total = sum(len(data) for data in built.files.values())
        del built
        objects = sorted(p for p in (store.root / "objects").rglob("*") if p.is_file())
        listing = root / "objects.txt"
        listing.write_text("".join(f"{p}\n" for p in objects))
        print(f"snapshot: {len(objects) - 1} artifacts, {total / 1e9:.3f} GB, {args.shards} shards; jobs {args.jobs}; "
              f"best of {args.repeat}; {os.cpu_count()} CPUs; sources in the page cache", flush=True)
        warm(objects)

        pulled, copied = root / "pulled", root / "copied"
        env = dict(os.environ, PREP_STORE=str(store.root))
        pull_cmd = [*PREP, "pull", "demo@latest", str(pulled), "--jobs", str(args.jobs), "--json"]
        copy_cmd = xargs(args.jobs, listing, f'cp "$0" {copied}/')
        hash_cmd = ["sh", "-c", f"ls -d {copied}/* | xargs -P {args.jobs} -n 1 openssl dgst -sha256 > /dev/null"]
        pulls, copies, hashes, syncs, inner, others = [], [], [], [], [], []
        other_env = dict(env, PYTHONPATH=str(args.compare_with)) if args.compare_with else None
        for _ in range(args.repeat):  # interleaved, so every tool sees the same machine
            if other_env is not None:
                shutil.rmtree(pulled, ignore_errors=True)
                run(["sync"])
                others.append(timed(lambda: run(pull_cmd[:-1], env=other_env, stderr=subprocess.DEVNULL, cwd="/")))
            shutil.rmtree(pulled, ignore_errors=True)
            shutil.rmtree(copied, ignore_errors=True)
            run(["sync"])
            started = time.perf_counter()
            report = json.loads(run(pull_cmd, env=env, stderr=subprocess.DEVNULL).stdout)
            pulls.append(time.perf_counter() - started)
            inner.append(report["seconds"])
            copied.mkdir()
            run(["sync"])
            copies.append(timed(lambda: run(copy_cmd)))
            hashes.append(timed(lambda: run(hash_cmd)))
            syncs.append(timed(lambda: run(["sync", "-f", str(copied)])))
        best = min(range(args.repeat), key=lambda i: copies[i] + hashes[i])
        rows = [
            (f"prep pull --jobs {args.jobs} (CLI, fsyncs each file)", min(pulls)),
            ("  of which the pull itself (in-process seconds)", min(inner)),
            (f"xargs -P {args.jobs} cp", copies[best]),
            (f"xargs -P {args.jobs} openssl dgst -sha256 (copies)", hashes[best]),
            ("cp + hash", copies[best] + hashes[best]),
            ("cp + hash + sync -f", copies[best] + hashes[best] + syncs[best]),
        ]
        if others:
            rows.insert(0, (f"prep pull of {args.compare_with} (CLI)", min(others)))
        for name, seconds in rows:
            print(f"{name:<52} {seconds:7.3f} s  {total / 1e9 / seconds:6.2f} GB/s")
        print(f"speed ratio prep pull / (cp + hash):        {(copies[best] + hashes[best]) / min(pulls):.2f}")
        print(f"speed ratio prep pull / (cp + hash + sync): {(copies[best] + hashes[best] + syncs[best]) / min(pulls):.2f}")
        if args.s3:
            s3_pull(root, store, args.jobs, args.s3_mb)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
