"""Benchmark (not a test): `prep diff` of two snapshots of a corpus of a million small documents.

    python -m tests.bench.bench_diff [--documents 1000000] [--files 8] [--words 100 300] [--workers 2] [--work DIR]

Writes a synthetic JSON Lines corpus (v1), then v2 with a few documents removed, edited and added
in every file (so the document diff has to read every file, the worst case), builds both with a
tiny tokenizer into one store (Megatron format only, to spare disk), and times `prep diff` with
and without `--documents` from the command line, reporting wall seconds and the peak RSS of the
diff process next to the corpus size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prep.sample import train_tokenizer

PREP = [sys.executable, "-m", "prep.cli.main"]
SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "an", "or", "el", "is", "um", "ba")
EDITS_PER_FILE = 25


@dataclass(frozen=True)
class Measurement:
    name: str
    seconds: float
    peak_rss: int
    exit_status: int


def vocabulary(rng: np.random.Generator, size: int = 4000) -> list[str]:
    return ["".join(rng.choice(SYLLABLES, size=int(rng.integers(1, 4)))) for _ in range(size)]


def write_file(path: Path, first_id: int, count: int, seed: int, words: list[str], lengths: tuple[int, int],
               edit: bool) -> None:
    """`count` documents of `lengths` words; with `edit`, drop, rewrite and append EDITS_PER_FILE each."""
    rng = np.random.default_rng(seed)
    lengths_drawn = rng.integers(lengths[0], lengths[1] + 1, size=count)
    picks = rng.integers(0, len(words), size=int(lengths_drawn.sum()))
    path.parent.mkdir(parents=True, exist_ok=True)
    position = 0
    with open(path, "w", encoding="utf-8") as out:
        for index, length in enumerate(lengths_drawn):
            text = " ".join(words[w] for w in picks[position:position + length])
            position += length
            if edit and index % (count // EDITS_PER_FILE) == 1:
                continue  # removed in v2
            if edit and index % (count // EDITS_PER_FILE) == 2:
                text = "edited " + text
            out.write(json.dumps({"id": f"doc-{first_id + index}", "text": text}) + "\n")
        if edit:
            out.writelines(json.dumps({"id": f"new-{first_id}-{extra}", "text": f"document {extra} added to file {first_id}"})
                           + "\n" for extra in range(EDITS_PER_FILE))


def pipeline(folder: Path, tokenizer: Path) -> Path:
    path = folder / "pipeline.toml"
    path.write_text(f'dataset = "bench"\nseed = 1\n\n[input]\npaths = ["corpus"]\nid_field = "id"\n\n'
                    f'[tokenizer]\npath = "{tokenizer}"\nbackend = "tokenizers"\n\n'
                    f'[output]\nshard_size = "64MB"\nformats = ["bin"]\n')
    return path


# Runs the command and prints its peak RSS (KiB) and wall seconds. Measuring from a fresh, small
# process matters: a child's peak RSS counts its parent's size at fork, and this one is large.
TRAMPOLINE = ("import resource, subprocess, sys, time\n"
              "started = time.perf_counter()\n"
              "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.perf_counter() - started, code)")


def measure(name: str, command: list[str]) -> Measurement:
    """Wall time and peak RSS of one command, from a small trampoline process."""
    output = subprocess.run([sys.executable, "-c", TRAMPOLINE, *command], check=True, capture_output=True,
                            text=True).stdout.split()
    return Measurement(name, float(output[1]), int(output[0]) * 1024, int(output[2]))


def best_of(repeat: int, name: str, command: list[str]) -> Measurement:
    runs = [measure(name, command) for _ in range(repeat)]
    return Measurement(name, min(r.seconds for r in runs), max(r.peak_rss for r in runs), runs[-1].exit_status)


def build_versions(work: Path, args: argparse.Namespace) -> None:
    """Write corpus v1 and the edited v2, and build both into `work/store` as bench@v1, bench@v2."""
    rng = np.random.default_rng(0)
    words = vocabulary(rng)
    tokenizer = train_tokenizer((" ".join(rng.choice(words, 50)) for _ in range(2000)), 300,
                                work / "tokenizer.json")
    per_file = args.documents // args.files
    store = work / "store"
    for version in ("v1", "v2"):
        started = time.perf_counter()
        for index in range(args.files):
            write_file(work / version / "corpus" / f"part-{index:03d}.jsonl", index * per_file, per_file,
                       seed=index, words=words, lengths=tuple(args.words), edit=version == "v2")
        corpus_bytes = sum(p.stat().st_size for p in (work / version / "corpus").iterdir())
        written = time.perf_counter() - started
        built = measure(f"build {version}", [*PREP, "build", str(pipeline(work / version, tokenizer)),
                                             "--store", str(store), "--workers", str(args.workers),
                                             "--tag", version])
        print(f"{version}: {corpus_bytes / 1e6:.0f} MB corpus written in {written:.1f} s, "
              f"built in {built.seconds:.1f} s (exit {built.exit_status})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--words", type=int, nargs=2, default=(100, 300), metavar=("MIN", "MAX"),
                        help="Words per document (a word is 1-3 syllables, about 5 bytes with its space).")
    parser.add_argument("--work", type=Path, default=None, help="Keep everything here (default: a temp folder).")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--measure-only", action="store_true",
                        help="Reuse the corpus and store a previous run left in --work; only time the diffs.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prep-bench-diff-") as temp:
        work = args.work or Path(temp)
        store = work / "store"
        if not args.measure_only:
            build_versions(work, args)
        corpus_bytes = sum(p.stat().st_size for p in (work / "v2" / "corpus").iterdir())
        diff = [*PREP, "diff", "bench@v1", "bench@v2", "--store", str(store)]
        commands = {"diff": diff, "diff --documents": [*diff, "--documents"],
                    "diff --documents --json": [*diff, "--documents", "--json"],
                    "floor: import prep.cli.history": [sys.executable, "-c", "import prep.cli.history"],
                    "floor: import prep.history.docdiff": [sys.executable, "-c", "import prep.history.docdiff"]}
        measure("warm the page cache", commands["diff --documents"])
        runs = [best_of(args.repeat, name, command) for name, command in commands.items()]
        print(f"\n{args.documents:,} documents in {args.files} files, corpus {corpus_bytes / 1e6:.0f} MB (v2); "
              f"best of {args.repeat} runs, peak RSS the largest")
        print(f"{'command':<50} {'seconds':>8} {'peak RSS':>10}  exit")
        for run in runs:
            print(f"{run.name:<50} {run.seconds:>8.2f} {run.peak_rss / 1e6:>8.0f} MB  {run.exit_status}")


if __name__ == "__main__":
    main()
