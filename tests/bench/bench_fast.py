"""Benchmark (not a test): the fast path against gigatoken's own ceiling, side by side.

    python -m tests.bench.bench_fast [--sizes 300,100,400] [--runs 1] [--workdir /tmp/prep-bench]

Ceiling: gigatoken's `encode_files` over the same JSON Lines files, all cores (only that call
is timed, so start-up counts against prep alone). Build: a complete `prep build` with
`backend = "gigatoken"` (dedup, shuffle, both formats, hashes, commits), --workers = cores, fresh
store, start-up included; then a no-change rebuild, and a fresh build with `--no-readback` (shard
files and snapshot not read back from the disk, the work a build did before issue 16). Prints
walls, MB/s of text, peak RSS of the process tree, and the ratio ceiling/build (target >= 0.35 on
2 cores). With `--runs N`, N rounds over the sizes in turn, then each size's median ceiling,
builds and ratios.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from tests.bench.benchsupport import Setup, corpus_bytes, measure, pipeline, prep_build, setup

CEILING = r"""
import json, sys, time
from pathlib import Path
import gigatoken
tok = gigatoken.Tokenizer.from_json(Path(sys.argv[2]).read_text())
paths = [str(p) for p in sorted(Path(sys.argv[1]).glob("*.jsonl"))]
started = time.perf_counter()
encoded = tok.encode_files(paths, parallel=True)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "documents": len(encoded)}))
"""


def one_size(bench: Setup, folder: Path) -> tuple[float, float, float]:
    """The ceiling, a fresh build, a no-change rebuild and a fresh `--no-readback` build of one
    corpus, printed; the ceiling's and both fresh builds' seconds."""
    text_bytes = corpus_bytes(folder)
    label = f"{text_bytes / 1e6:.0f}MB"
    ceiling = measure([sys.executable, "-c", CEILING, str(folder), str(bench.tokenizer)])
    ceiling_seconds = float(json.loads(ceiling.stdout)["seconds"])
    store = bench.workdir / "store-fast"
    shutil.rmtree(store, ignore_errors=True)
    spec = pipeline(bench.workdir, folder, bench.tokenizer, "gigatoken")
    build = prep_build(spec, store, bench.workers)
    rebuild = prep_build(spec, store, bench.workers)
    shutil.rmtree(store)
    unchecked = prep_build(spec, store, bench.workers, "--no-readback")
    rows = [("gigatoken encode_files", ceiling_seconds, ceiling.peak_rss, ""),
            ("prep build (fast)", build.seconds, build.peak_rss, f"{ceiling_seconds / build.seconds:6.2f}"),
            ("prep build, no change", rebuild.seconds, rebuild.peak_rss, ""),
            ("prep build --no-readback", unchecked.seconds, unchecked.peak_rss,
             f"{ceiling_seconds / unchecked.seconds:6.2f}")]
    for what, seconds, rss, ratio in rows:
        print(f"{label:>8} {what:<24} {seconds:8.2f} {text_bytes / seconds / 1e6:7.1f} {rss / 2**20:8.0f}M {ratio:>6}",
              flush=True)
    return ceiling_seconds, build.seconds, unchecked.seconds


def main() -> None:
    """`--runs` rounds over every size in turn (a slow spell of the machine falls on all alike),
    then each size's median ceiling, build and ratio."""
    bench = setup(__doc__, "300,100,400")
    print(f"{'corpus':>8} {'what':<24} {'seconds':>8} {'MB/s':>7} {'peak RSS':>9} {'ratio':>6}")
    measured: dict[Path, list[tuple[float, float, float]]] = {}
    for _ in range(bench.runs):
        for folder in bench.corpora:
            measured.setdefault(folder, []).append(one_size(bench, folder))
    if bench.runs > 1:
        print(f"medians of {bench.runs} runs:")
        for folder, runs in measured.items():
            ceiling, build, unchecked = (statistics.median(seconds) for seconds in zip(*runs))
            print(f"  {folder.name}: ceiling {ceiling:.2f} s; ratios of the medians: build {build:.2f} s "
                  f"{ceiling / build:.2f} ({_each(runs, 1)}), --no-readback {unchecked:.2f} s "
                  f"{ceiling / unchecked:.2f} ({_each(runs, 2)})", flush=True)


def _each(runs: list[tuple[float, float, float]], which: int) -> str:
    """Each run's ratio of the ceiling to the build in column `which`, lowest first."""
    return "each run: " + ", ".join(f"{r:.2f}" for r in sorted(run[0] / run[which] for run in runs))


if __name__ == "__main__":
    main()
