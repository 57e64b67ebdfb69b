"""Benchmark (not a test): what the read-back before publish costs, on a local store and on S3 (moto).

    python -m tests.bench.bench_readback [--mb 40] [--workers 2] [--repeat 2]

Run it from a copy of the package when others edit the tree (PYTHONPATH=<copy>:.), or a
changed source hash turns the rebuild into a cold build, and fresh workers refuse a stale driver.

For each store, side by side in one run: a cold build with read-back, a cold build with
`--no-readback` (fresh stores, so both do all the work), and a rebuild of the same snapshot under a
new tag (its read-back record exists: nothing is read). Reports each build's wall time, the
read-back's own time and bytes, and the ratios. Library API in this process, the local pool
executor; S3 is moto's threaded server on loopback (tests/s3support.py), so its figures are an
upper bound on request overhead, not a model of a real region.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prep import code
from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import BuildResult, PublishOptions, build
from prep.runner.executors.pool import LocalExecutor
from prep.runner.tasks import prepare_worker
from prep.storage import open_store
from tests.bench.benchsupport import corpus, pipeline, tokenizer


@dataclass(frozen=True)
class Timed:
    seconds: float
    result: BuildResult


def timed_build(pipeline_path: Path, store_url: str, workers: int, options: PublishOptions) -> Timed:
    code.source_hash.cache_clear()
    executor = LocalExecutor(workers, prepare_worker)
    try:
        started = time.perf_counter()
        result = build(load_pipeline(pipeline_path), open_store(store_url), executor, progress=Progress(quiet=True),
                       options=options)
        return Timed(time.perf_counter() - started, result)
    finally:
        executor.close()


def best(runs: list[Timed]) -> Timed:
    return min(runs, key=lambda run: run.seconds)


def one_store(name: str, new_store: Callable[[], str], pipeline_path: Path, workers: int, repeat: int) -> None:
    """Cold with and without read-back (interleaved, best of `repeat`), then a tagged rebuild."""
    with_readback: list[Timed] = []
    without: list[Timed] = []
    for _ in range(repeat):
        with_readback.append(timed_build(pipeline_path, new_store(), workers, PublishOptions()))
        without.append(timed_build(pipeline_path, new_store(), workers, PublishOptions(readback=False)))
    on, off = best(with_readback), best(without)
    store_url = new_store()
    timed_build(pipeline_path, store_url, workers, PublishOptions())
    again = timed_build(pipeline_path, store_url, workers, PublishOptions(tags=("bench-tag",)))
    readback = on.result.readback
    print(f"\n{name}: {readback.objects} objects, {readback.bytes_read / 1e6:.1f} MB read back")
    print(f"  cold build, read-back on    {on.seconds:7.2f} s  (read-back itself {readback.seconds:.3f} s, "
          f"{readback.bytes_read / 1e6 / max(readback.seconds, 1e-9):.0f} MB/s)")
    print(f"  cold build, --no-readback   {off.seconds:7.2f} s")
    print(f"  rebuild, new tag (recorded) {again.seconds:7.2f} s  (read-back {again.result.readback.seconds:.4f} s, "
          f"{again.result.readback.checked} objects read)")
    print(f"  ratios: read-back / cold build = {readback.seconds / on.seconds:.3f}; "
          f"on / off = {on.seconds / off.seconds:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=40, help="corpus size in MB")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 store")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = corpus(args.workdir, args.mb)
    tok = tokenizer(corpus(args.workdir, 100), args.workdir / "tokenizer-50257.json")
    scratch = Path(tempfile.mkdtemp(prefix="bench-readback-", dir=args.workdir))
    try:
        text = pipeline(scratch, data, tok, "tokenizers").read_text().replace('"256MB"', '"16MB"')
        pipeline_path = scratch / "readback.toml"
        pipeline_path.write_text(text)
        count = iter(range(1_000_000))
        one_store("local store", lambda: str(scratch / f"store-{next(count)}"), pipeline_path, args.workers,
                  args.repeat)
        if not args.no_s3:
            run_s3(pipeline_path, args.workers, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_s3(pipeline_path: Path, workers: int, repeat: int) -> None:
    """The same on a fresh bucket per store of moto's server (its environment set for the workers too)."""
    import logging

    from moto.server import ThreadedMotoServer

    from tests.s3support import new_bucket, s3_env

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(s3_env(f"http://{host}:{port}"))
    try:
        one_store("S3 (moto, loopback)", lambda: f"{new_bucket()}/store", pipeline_path, workers, repeat)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
