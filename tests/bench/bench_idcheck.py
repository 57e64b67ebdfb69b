"""Benchmark (not a test): checking that one large file's ids are unique across its parts.

    python -m tests.bench.bench_idcheck [--millions 2,8] [--workdir /tmp/prep-bench]

An order task checks the ids of each input file that was cut into several parts
(prep/stages/idcheck.py). For files of MILLIONS million documents (parts of 200k ids like
"file-00000:123456"), side by side in one run, each in a fresh process: the check as it runs (at
most IDS_PER_PARTITION ids in memory, the rest spilled by id hash) and the check with the whole
file in memory (the partition size lifted): seconds and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from prep.workfiles.intermediate import IntermediateWriter
from tests.bench.benchsupport import REPO, measure

PART_IDS = 200_000
CHECK = """
import json, sys, time
from pathlib import Path
from prep.stages import idcheck
if sys.argv[2] == "whole":
    idcheck.IDS_PER_PARTITION = 1 << 62
paths = sorted(Path(sys.argv[1]).glob("*.part"))
started = time.perf_counter()
idcheck.check_unique_ids("big.jsonl", paths, Path(sys.argv[1]))
print(json.dumps({"seconds": time.perf_counter() - started}))
"""


def make_parts(folder: Path, documents: int) -> Path:
    """Intermediates (made once) holding a file's ids, in parts of PART_IDS, no repeat."""
    if folder.is_dir():
        return folder
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for part, low in enumerate(range(0, documents, PART_IDS)):
        count = min(documents, low + PART_IDS) - low
        ids = pa.array([f"file-{part:05d}:{row}" for row in range(low, low + count)], type=pa.string())
        offsets = np.arange(count + 1, dtype=np.int64)
        with IntermediateWriter(staging / f"{part:05d}.part", np.dtype(np.uint16), durable=False) as writer:
            writer.write_columns(np.arange(count), ids, b"t" * count, offsets, bytes(16 * count),
                                 np.zeros(count, dtype=bool), np.zeros(count, dtype=np.uint16), offsets)
    staging.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--millions", default="2,8", help="comma-separated file sizes, in millions of ids")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    args = parser.parse_args()
    print(f"{'ids':>6} {'check':<34} {'seconds':>8} {'peak RSS':>9}")
    for millions in (float(value) for value in args.millions.split(",")):
        folder = make_parts(args.workdir / f"idcheck-{millions:g}M", int(millions * 1e6))
        for mode, label in (("spilled", "as it runs (1M ids at a time)"), ("whole", "whole file in memory")):
            run = measure([sys.executable, "-c", CHECK, str(folder), mode], cwd=REPO)
            seconds = json.loads(run.stdout)["seconds"]
            print(f"{millions:5g}M {label:<34} {seconds:8.2f} {run.peak_rss / 2**20:8.0f}M", flush=True)


if __name__ == "__main__":
    main()
