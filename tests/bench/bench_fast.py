"""Benchmark (not a test): the fast path against gigatoken's own ceiling, side by side.

    python -m tests.bench.bench_fast [--sizes 300,100,400] [--runs 1] [--workdir /tmp/prep-bench]

Ceiling: gigatoken's `encode_files` over the same JSON Lines files, all cores (only that call
is timed, so start-up counts against prep alone). Build: a complete `prep build` with
`backend = "gigatoken"` (dedup, shuffle, both formats, hashes, commits), --workers = cores, fresh
store, start-up included; then a no-change rebuild. Prints walls, MB/s of text, peak RSS of the
process tree, and the ratio ceiling/build (target >= 0.25 on 2 cores). With `--runs N`, N rounds
over the sizes in turn, then each size's median ceiling, build and ratio.
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


def one_size(bench: Setup, folder: Path) -> tuple[float, float]:
    """The ceiling, a fresh build and a no-change rebuild of one corpus, printed; the ceiling's and
    the build's seconds."""
    text_bytes = corpus_bytes(folder)
    label = f"{text_bytes / 1e6:.0f}MB"
    ceiling = measure([sys.executable, "-c", CEILING, str(folder), str(bench.tokenizer)])
    ceiling_seconds = float(json.loads(ceiling.stdout)["seconds"])
    store = bench.workdir / "store-fast"
    shutil.rmtree(store, ignore_errors=True)
    spec = pipeline(bench.workdir, folder, bench.tokenizer, "gigatoken")
    build = prep_build(spec, store, bench.workers)
    rebuild = prep_build(spec, store, bench.workers)
    rows = [("gigatoken encode_files", ceiling_seconds, ceiling.peak_rss, ""),
            ("prep build (fast)", build.seconds, build.peak_rss, f"{ceiling_seconds / build.seconds:6.2f}"),
            ("prep build, no change", rebuild.seconds, rebuild.peak_rss, "")]
    for what, seconds, rss, ratio in rows:
        print(f"{label:>8} {what:<24} {seconds:8.2f} {text_bytes / seconds / 1e6:7.1f} {rss / 2**20:8.0f}M {ratio:>6}",
              flush=True)
    return ceiling_seconds, build.seconds


def main() -> None:
    """`--runs` rounds over every size in turn (a slow spell of the machine falls on all alike),
    then each size's median ceiling, build and ratio."""
    bench = setup(__doc__, "300,100,400")
    print(f"{'corpus':>8} {'what':<24} {'seconds':>8} {'MB/s':>7} {'peak RSS':>9} {'ratio':>6}")
    measured: dict[Path, list[tuple[float, float]]] = {}
    for _ in range(bench.runs):
        for folder in bench.corpora:
            measured.setdefault(folder, []).append(one_size(bench, folder))
    if bench.runs > 1:
        print(f"medians of {bench.runs} runs:")
        for folder, pairs in measured.items():
            ceiling, build = (statistics.median(seconds) for seconds in zip(*pairs))
            ratios = sorted(c / b for c, b in pairs)
            print(f"  {folder.name}: ceiling {ceiling:.2f} s, build {build:.2f} s, ratio of the medians "
                  f"{ceiling / build:.2f} (each run's: {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)


if __name__ == "__main__":
    main()
