"""Benchmark (not a test): the merge level against reading every part (issue 13).

    python -m tests.bench.bench_merge [--docs 4,16] [--fan-ins 4,16] [--workdir /tmp/prep-bench]

For each corpus of short documents (bench_scale's, made once under the workdir), `prep build`
with formats ["bin"] into a fresh store, once with the default `[build] merge_fan_in` (no merge
below 128 parts: every order task reads every part) and once with each fan-in given, side by side
in one run. Prints wall seconds, the merge rounds' and the order stage's seconds, how many
entries objects each order task read and the order stage's reads in all (buckets x objects), the
merged build's ratio to the unmerged one, and whether the snapshot ids agree (they must).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from pathlib import Path

from tests.bench.bench_scale import SOURCE_MB, build, short_corpus, write_pipeline
from tests.bench.benchsupport import corpus, stage_megabytes, stage_seconds, tokenizer

_ORDER = re.compile(r"order: (\d+) buckets? from (?:(\d+) runs? of )?(\d+) parts?")
_MERGE = re.compile(r"\] merge: done in ([0-9.]+)s, round (\d+): (\d+) tasks? run")


def _with_fan_in(pipeline: Path, fan_in: int | None) -> Path:
    """The pipeline with `[build] merge_fan_in` set (None: the default)."""
    if fan_in is None:
        return pipeline
    path = pipeline.with_name(f"{pipeline.stem}-fan-in-{fan_in}.toml")
    path.write_text(pipeline.read_text() + f"\n[build]\nmerge_fan_in = {fan_in}\n")
    return path


def compare(args: argparse.Namespace, tok: Path) -> None:
    print(f"{'docs':>5} {'fan-in':>7} {'seconds':>8} {'merge s':>8} {'rounds':>6} {'merges':>6} {'order s':>8} "
          f"{'per task':>8} {'reads':>7} {'ratio':>6}  snapshot")
    for millions in args.docs:
        folder = short_corpus(args.workdir, int(millions * 1e6))
        pipeline = write_pipeline(args.workdir, folder, tok, ["bin"])
        baseline, snapshot = 0.0, ""
        for fan_in in [None, *args.fan_ins, None]:  # the default first and last: drift shows
            store = args.workdir / "store-merge"
            shutil.rmtree(store, ignore_errors=True)
            run = build(_with_fan_in(pipeline, fan_in), store, args.workers)
            merges = [match for match in _MERGE.finditer(run.stderr)]
            order = _ORDER.search(run.stderr)
            assert order is not None, run.stderr
            buckets, objects = int(order[1]), int(order[2] or order[3])
            baseline = baseline or run.seconds
            ident = run.stdout.split()[-1]
            snapshot = snapshot or ident
            print(f"{millions:>4g}M {fan_in or 'default':>7} {run.seconds:8.2f} "
                  f"{sum(float(m[1]) for m in merges):8.2f} {len(merges):6d} {sum(int(m[3]) for m in merges):6d} "
                  f"{stage_seconds(run.stderr).get('order', 0):8.2f} {objects:8d} {buckets * objects:7d} "
                  f"{baseline / run.seconds:6.2f}  {'same' if ident == snapshot else 'DIFFERENT ' + ident}", flush=True)
            print(f"      largest process by stage, sampled (MB): {stage_megabytes(run)}", flush=True)
            shutil.rmtree(store, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", default="4,16", help="corpus sizes in millions of documents, comma-separated")
    parser.add_argument("--fan-ins", default="4,16", help="merge fan-ins to compare with the default")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    args.docs = [float(size) for size in args.docs.split(",")]
    args.fan_ins = [int(fan_in) for fan_in in args.fan_ins.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(corpus(args.workdir, SOURCE_MB), args.workdir / "tokenizer-50257.json")
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}", flush=True)
    compare(args, tok)


if __name__ == "__main__":
    main()
