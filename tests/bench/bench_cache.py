"""Benchmark (not a test): reading a snapshot straight from S3 three ways, side by side in one run,
against moto's S3 server on loopback with a fixed latency added to every request.

    python -m tests.bench.bench_cache --mb 256 --shard-mb 16 --latency-ms 20 --jobs 8

The server runs in its own process (`--serve`, started by the benchmark): moto's ThreadedMotoServer
with its WSGI app wrapped so that every request sleeps `--latency-ms` before it is handled (the
handler threads sleep in parallel, as a real network round trip would). Then, on one snapshot of
random uint16 shards:

(a) no cache: every window is one ranged GET (`Store.get_range`), `--jobs` at a time; it runs
    `--range-steps` steps and projects the epoch from them (every step costs the same);
(b) pull then read: `prep.transfer.pull.pull` with `--jobs`, then an epoch from the folder;
(c) the node-local cache with prefetch (cache_bytes = the snapshot, `--jobs` fetches): an epoch
    straight from the bucket.

For each: epoch seconds, fetch_seconds (the time the consumer waited for batches) in total and
after the first batch, and for (c) against (b) the ratio of the read phases. Every batch of (a) and
(c) is checked row for row against (b)'s.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

SEQ_LEN, GLOBAL_BATCH = 2048, 64


class Latency:
    """WSGI middleware: each request waits `seconds` before moto handles it."""

    def __init__(self, app: Callable[..., Iterable[bytes]], seconds: float) -> None:
        self.app, self.seconds = app, seconds

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        time.sleep(self.seconds)
        return self.app(environ, start_response)


def serve(port: int, latency: float) -> None:
    """Run moto's S3 server with the latency wrapper until killed (the `--serve` mode)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    assert server._server is not None
    server._server.app = Latency(server._server.app, latency)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


def start_server(latency_ms: float) -> tuple[subprocess.Popen[str], str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "tests.bench.bench_cache", "--serve", str(port),
                                "--latency-ms", str(latency_ms)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process, f"http://127.0.0.1:{port}"


def make_snapshot(url: str, work: Path, mb: int, shard_mb: int) -> Any:
    """Random uint16 shards in the bucket, published as `bench@latest`."""
    from prep.storage import open_store
    from prep.store import cas
    from prep.store.refs import move_ref
    from prep.store.snapshots import publish_manifest
    from tests.snapshot_factory import manifest_for

    store = open_store(url)
    rng = np.random.default_rng(0)
    artifacts = []
    work.mkdir(parents=True, exist_ok=True)
    for shard in range(max(1, mb // shard_mb)):
        path = work / f"{shard:05d}.bin"
        path.write_bytes(rng.integers(0, 50000, size=(shard_mb << 20) // 2, dtype=np.uint16).tobytes())
        digest = cas.put_file(store, path)
        path.unlink()
        artifacts.append({"path": f"bin/{shard:05d}.bin", "format": "bin", "shard": shard, "size": digest.size,
                          "sha256": digest.sha256, "documents": 1, "tokens": digest.size // 2})
    snapshot = publish_manifest(store, manifest_for("bench", artifacts))
    move_ref(store, "bench", "latest", snapshot.id)
    return store, snapshot


def timed_epoch(reader: Any, steps: int, check: Any | None = None, compute: float = 0.0) -> dict[str, float]:
    """Read `steps` batches, `compute` seconds of simulated training after each: wall, first batch,
    fetch_seconds (the time batch() took) in total and after the first batch."""
    started = time.perf_counter()
    first = first_wait = 0.0
    for step in range(steps):
        batch = reader.batch(step)
        if compute:
            time.sleep(compute)
        if step == 0:
            first = time.perf_counter() - started
            first_wait = reader.stats()["fetch_seconds"]
        if check is not None:
            paused = time.perf_counter()
            assert (batch == check.batch(step)).all(), f"step {step} differs"
            started += time.perf_counter() - paused  # checking is not reading
    wall = time.perf_counter() - started
    waited = reader.stats()["fetch_seconds"]
    return {"wall": wall, "first_batch": first, "fetch_seconds": waited, "fetch_after_first": waited - first_wait}


class RangeReader:
    """(a): a batch is one ranged GET per window (two when it crosses a shard), `jobs` at a time."""

    def __init__(self, store: Any, plan: Any, jobs: int) -> None:
        from prep.store import cas

        self.store, self.plan = store, plan
        source = plan.sources[0]
        self.starts = source.token_starts
        self.keys = [cas.object_key(shard.bin_sha256) for shard in source.shards]
        self.tokens = [shard.tokens for shard in source.shards]
        self.pool = ThreadPoolExecutor(jobs)
        self.waited = 0.0

    def _row(self, start: int) -> np.ndarray:
        pieces, count = [], SEQ_LEN + 1
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while count:
            offset = start - int(self.starts[shard])
            take = min(count, self.tokens[shard] - offset)
            pieces.append(np.frombuffer(self.store.get_range(self.keys[shard], offset * 2, take * 2), np.uint16))
            start, count, shard = start + take, count - take, shard + 1
        return np.concatenate(pieces)

    def batch(self, step: int) -> np.ndarray:
        started = time.perf_counter()
        ((_, starts, _),) = self.plan.spans(step)
        rows = np.stack(list(self.pool.map(self._row, starts.tolist()))).astype(np.int64)
        self.waited += time.perf_counter() - started
        return rows

    def stats(self) -> dict[str, float]:
        return {"fetch_seconds": self.waited}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from prep.data.reader import Reader
    from prep.transfer.pull import pull
    from tests.s3support import s3_env

    server, endpoint = start_server(args.latency_ms)
    try:
        os.environ.update(s3_env(endpoint))
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        work = Path(tempfile.mkdtemp(prefix="prep-bench-cache-", dir=args.workdir))
        store, snapshot = make_snapshot("s3://bench/data", work / "shards", args.mb, args.shard_mb)
        size = sum(a["size"] for a in snapshot.artifacts)
        started = time.perf_counter()
        pull(store, snapshot, work / "dest", jobs=args.jobs)
        pulled_seconds = time.perf_counter() - started
        pulled = Reader(work / "dest", seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH)
        steps = pulled.sizes[0] // GLOBAL_BATCH
        check = Reader(work / "dest", seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH)
        b = timed_epoch(pulled, steps)
        a = timed_epoch(RangeReader(store, check, args.jobs), args.range_steps, check)
        runs = []
        for name, compute in (("cache", 0.0), ("cache-compute", args.compute_ms / 1000)):
            with open_cached(Reader, work / name, size, args.jobs) as cached:
                runs.append({**timed_epoch(cached, steps, check, compute), "cache": cached.stats()["cache"]})
                if not compute:
                    warm = warm_read_phases(pulled, cached, steps, args.repeat)
        c, c_compute = runs
        b_compute = timed_epoch(Reader(work / "dest", seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH), steps,
                                compute=args.compute_ms / 1000)
    finally:
        server.kill()
    return {"snapshot_bytes": size, "shards": len(snapshot.artifacts), "steps": steps, "latency_ms": args.latency_ms,
            "jobs": args.jobs, "repeat": args.repeat, "a_steps": args.range_steps, "a": a,
            "b_pull_seconds": pulled_seconds, "b": b, "c": c, "compute_ms": args.compute_ms, "b_compute": b_compute,
            "c_compute": c_compute, "warm": warm}


def warm_read_phases(pulled: Any, cached: Any, steps: int, repeat: int) -> dict[str, float]:
    """Steps 1.. again on both readers (the cache now full), alternating, best of `repeat` each:
    the read phases side by side with the machine's noise spread over both, in wall and in this
    process's CPU seconds (the server runs in its own process)."""
    best = {"b": float("inf"), "c": float("inf"), "b_cpu": float("inf"), "c_cpu": float("inf")}
    for _ in range(repeat):
        for name, reader in (("b", pulled), ("c", cached)):
            started, cpu = time.perf_counter(), time.process_time()
            for step in range(1, steps):
                reader.batch(step)
            best[name] = min(best[name], time.perf_counter() - started)
            best[f"{name}_cpu"] = min(best[f"{name}_cpu"], time.process_time() - cpu)
    return best


def open_cached(reader_class: Any, cache_dir: Path, size: int, jobs: int) -> Any:
    """(c)'s reader: straight from the bucket through a fresh cache as large as the snapshot."""
    return reader_class("bench@latest", seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH, store="s3://bench/data",
                        cache_dir=cache_dir, cache_bytes=size, jobs=jobs)


def report(result: dict[str, Any]) -> None:
    a, b, c, steps = result["a"], result["b"], result["c"], result["steps"]
    a_epoch = a["wall"] / result["a_steps"] * steps
    c_read = c["wall"] - c["first_batch"]
    print(f"snapshot: {result['snapshot_bytes'] / 1e6:.0f} MB in {result['shards']} shards, {steps} steps of "
          f"{GLOBAL_BATCH} x {SEQ_LEN + 1} tokens, {result['latency_ms']:.0f} ms per request, {result['jobs']} jobs")
    print(f"(a) no cache, a ranged GET per window: {a['wall'] / result['a_steps'] * 1000:.1f} ms/step over "
          f"{result['a_steps']} steps -> epoch ~{a_epoch:.1f} s (projected), fetch_seconds = wall")
    print(f"(b) pull then read: pull {result['b_pull_seconds']:.2f} s, read {b['wall']:.2f} s "
          f"(fetch_seconds {b['fetch_seconds']:.2f}), epoch {result['b_pull_seconds'] + b['wall']:.2f} s")
    print(f"(c) cache + prefetch: epoch {c['wall']:.2f} s = first batch {c['first_batch']:.2f} s + read {c_read:.2f} s; "
          f"fetch_seconds {c['fetch_seconds']:.2f} total, {c['fetch_after_first']:.3f} after the first batch "
          f"({c['fetch_after_first'] / c_read:.1%} of wall after it)")
    print(f"(c) read phase / (b) read phase: {c_read / b['wall']:.2f}x (target <= 1.2); (c) epoch / (b) pull + read: "
          f"{c['wall'] / (result['b_pull_seconds'] + b['wall']):.2f}x; (a) epoch / (c) epoch: {a_epoch / c['wall']:.0f}x")
    print(f"(c) cache: {json.dumps(c['cache'])}")
    warm = result["warm"]
    print(f"read phases again, alternating, best of {result['repeat']}: (b) {warm['b']:.3f} s, (c) {warm['c']:.3f} s: "
          f"{warm['c'] / warm['b']:.2f}x (target <= 1.2); CPU {warm['b_cpu']:.3f} s vs {warm['c_cpu']:.3f} s: "
          f"{warm['c_cpu'] / warm['b_cpu']:.2f}x, {warm['b_cpu'] / (steps - 1) * 1e3:.3f} vs "
          f"{warm['c_cpu'] / (steps - 1) * 1e3:.3f} ms a step")
    bc, cc = result["b_compute"], result["c_compute"]
    cc_after = cc["wall"] - cc["first_batch"]
    print(f"with {result['compute_ms']:.0f} ms of simulated training per step: (b) read {bc['wall']:.2f} s, "
          f"fetch_seconds {bc['fetch_seconds']:.3f} ({bc['fetch_seconds'] / bc['wall']:.1%} of wall); (c) epoch "
          f"{cc['wall']:.2f} s, first batch {cc['first_batch']:.2f} s, fetch_seconds after it {cc['fetch_after_first']:.3f} "
          f"({cc['fetch_after_first'] / cc_after:.1%} of wall after the first batch, target < 5%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256, help="snapshot size in MB")
    parser.add_argument("--shard-mb", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--range-steps", type=int, default=20, help="steps (a) runs before projecting its epoch")
    parser.add_argument("--repeat", type=int, default=5, help="warm read phases timed, best of")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="simulated training per step, second runs")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.latency_ms / 1000)
        return
    report(run(args))


if __name__ == "__main__":
    main()
