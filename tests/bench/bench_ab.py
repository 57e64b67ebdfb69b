"""Benchmark (not a test): two checkouts of prep building the same corpora, alternated round by round.

    python -m tests.bench.bench_ab --old DIR [--new DIR] [--fast-mb 300] [--docs 4] [--rounds 5]
                                   [--workdir /tmp/prep-bench]

A refactor must keep the build's speed (issue 40): this runs a complete fresh `prep build` of
bench_fast's real-text corpus (`--fast-mb`, bin and wds) and of bench_scale's short-document
corpus (`--docs` million documents, bin), once with the code of each checkout per round, the
order of the two flipped every round so a slow spell of the machine falls on both alike. DIR is a
checkout (`git worktree add DIR REV`); each build runs with DIR as its working folder, so it
imports that checkout's prep. Prints every build's wall seconds, then per corpus the median of
each checkout and new/old.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from tests.bench.bench_scale import SOURCE_MB, short_corpus, write_pipeline
from tests.bench.benchsupport import REPO, corpus, measure_tree, pipeline, tokenizer


def build_seconds(checkout: Path, spec: Path, store: Path, workers: int) -> float:
    """The wall seconds of a fresh build of `spec` by the prep of `checkout`."""
    shutil.rmtree(store, ignore_errors=True)
    run = measure_tree([sys.executable, "-m", "prep.cli.main", "build", str(spec), "--store", str(store),
                        "--workers", str(workers)], cwd=checkout)
    if not run.stdout.strip().startswith("sha256:"):
        raise SystemExit(f"the build in {checkout} failed:\n{run.stderr}")
    shutil.rmtree(store)
    return run.seconds


def main() -> None:
    """Alternate the two checkouts over both corpora, then print the medians and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the checkout to compare against")
    parser.add_argument("--new", type=Path, default=REPO, help="the checkout measured (default: this one)")
    parser.add_argument("--fast-mb", type=int, default=300, help="MB of bench_fast's real-text corpus (0: skip)")
    parser.add_argument("--docs", type=int, default=4, help="millions of bench_scale's short documents (0: skip)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    specs: dict[str, Path] = {}
    tok = tokenizer(corpus(args.workdir, SOURCE_MB), args.workdir / "tokenizer-50257.json")
    if args.fast_mb:
        specs[f"{args.fast_mb} MB bin+wds"] = pipeline(args.workdir, corpus(args.workdir, args.fast_mb), tok, "gigatoken")
    if args.docs:
        folder = short_corpus(args.workdir, args.docs * 1_000_000)
        specs[f"{args.docs}M docs bin"] = write_pipeline(args.workdir, folder, tok, ["bin"])
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    seconds: dict[tuple[str, str], list[float]] = {}
    for round_index in range(args.rounds):
        order = ["old", "new"] if round_index % 2 == 0 else ["new", "old"]
        for label, spec in specs.items():
            for which in order:
                taken = build_seconds(checkouts[which], spec, args.workdir / "store-ab", args.workers)
                seconds.setdefault((label, which), []).append(taken)
                print(f"round {round_index + 1} {label:<16} {which}: {taken:7.2f} s", flush=True)
    print(f"medians of {args.rounds} rounds:")
    for label in specs:
        old, new = (statistics.median(seconds[label, which]) for which in ("old", "new"))
        print(f"  {label:<16} old {old:7.2f} s  new {new:7.2f} s  new/old {new / old:5.3f}", flush=True)


if __name__ == "__main__":
    main()
