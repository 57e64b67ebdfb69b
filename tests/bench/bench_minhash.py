"""Benchmark (not a test): prep's near-duplicate MinHash signatures against datasketch and rensa on
the same shingles of the same real text, in one run, rounds alternated (issue 42).

    python -m tests.bench.bench_minhash --mb 20 --rounds 3
        [--permutations 128] [--ngram 5] [--workdir /tmp/prep-bench] [--venv /tmp/minhash-venv]
        [--corpus DIR]

The corpus is bench_fast's real text (../shared/bench/make_corpus.py: Python sources, Debian
changelogs and manual pages), 100 MB made once under --workdir (or the JSON Lines of --corpus), of which --mb MB of whole
documents drawn with a fixed seed (in corpus order: code and prose alike) are put into batches as
the tokenize stage holds them (at most 65,536 documents or 8 MiB of text, one UTF-8 buffer with
offsets). datasketch and rensa run in a
virtualenv of their own (--venv, made on demand with `python -m venv`, `pip install numpy xxhash
datasketch rensa` and prep itself with --no-deps, never in prep's environment): when they cannot
be imported here the script runs itself again with that virtualenv's Python.

The sides, each over every batch, their CPU seconds (one process, single-threaded: rensa's thread
pool is rayon's, `RAYON_NUM_THREADS` set to 1; earlier runs set `RENSA_THREADS`, which rensa does
not read, so its two threads' CPU was summed) per round, medians of --rounds rounds in which the sides alternate
(reversed every other round):

* prep: `prep.neardup.signatures.signatures` on each batch's buffer: normalization, words, word
  and shingle hashes and MinHash, all of it (normalization compiled but for the stretches it
  leaves to Python, the rest in one compiled pass a document: prep.neardup.kernel, numba from the
  `fast` extra; the kernels loaded and the case table built before the rounds, each once a
  process, their times printed).
* prep core: `signatures.minhash` alone, on prep's shingle hashes made before the timed pass: the
  compiled MinHash loop.
* prep, numpy text path: words, word and shingle hashes by numpy's whole-array passes, then the
  compiled MinHash loop (what prep ran before the compiled text pass).
* prep, numpy and prep core, numpy: all of it by numpy, and numpy's MinHash alone
  (`numpy_minhash`): what runs without numba. All of prep's sides give the same signatures.
* shingling: what a datasketch or rensa user pays before either runs: each text decoded, NFC,
  lowercased, split, and its `ngram`-word shingles joined as strings (prep's definitions).
* rensa: `RMinHash.digest_matrix_from_token_sets` over those shingle strings, per batch (rensa
  hashes the strings itself, in Rust).
* rensa core: `RMinHash.digest_matrix_from_flat_token_hashes` on prep's shingle hashes, in Rust
  (SIMD). Up to rensa 0.4 that is the same algorithm as prep's, a minimum per permutation over
  every shingle (64-bit multiply-add-shift permutations; prep's are multiply-shift); from 0.5 it is
  another sketch (bucket rounds after Dahlgaard, Knudsen and Thorup's Fast Similarity Sketching,
  a permutation computed over every shingle only for the coordinates the rounds leave empty), whose
  cost per document grows with shingles + permutations rather than their product. The rensa
  version is printed; --venv with rensa 0.4 measures the same algorithm.
* datasketch: `MinHash.bulk` over the shingles as UTF-8 bytes (SHA-1 per shingle, numpy per
  document), on a seeded sample of whole documents of --datasketch-mb MB (it is slow).

The figure that counts is each ratio (peer's time over prep's on the same documents): prep against
shingling + rensa and shingling + datasketch (from text, what a user of each runs), against rensa
alone (the shingles given for free) and prep core against rensa core (the MinHash arithmetic).
Before timing, the distinct shingle count of every document is checked to be the same on both sides.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import statistics
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep.neardup import kernel
from prep.neardup.normalization import case_table
from prep.neardup.signatures import hash_family, minhash, numpy_minhash, shingle_hashes, signatures
from tests.bench.benchsupport import REPO, corpus

Array = np.ndarray[Any, Any]
BATCH_DOCUMENTS, BATCH_TEXT_BYTES = 65_536, 8 * 2**20
PEERS = ("numpy", "xxhash", "datasketch", "rensa", "numba")  # numba: prep's `fast` extra, its compiled MinHash


@dataclass(frozen=True)
class Batch:
    """One batch of documents: prep's input, the peers' shingles and prep's shingle hashes."""

    blob: bytes
    offsets: Array
    shingles: list[list[str]]
    hashes: Array
    bounds: Array


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20, help="MB of the corpus's documents to sign")
    parser.add_argument("--datasketch-mb", type=float, default=4, help="MB of them datasketch also signs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--permutations", type=int, default=128)
    parser.add_argument("--ngram", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--corpus", type=Path, help="a folder of JSON Lines to draw from instead (bench_neardup's)")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/minhash-venv"))
    args = parser.parse_args()
    if not _peers_importable():
        _rerun_in(args.venv)
        return
    os.environ["RAYON_NUM_THREADS"] = "1"  # rensa's thread pool (rayon): one thread, as prep's side runs
    start = time.perf_counter()
    if kernel.compiled() is None:
        raise SystemExit("numba (prep's `fast` extra) is not importable: prep would sign with numpy alone")
    print(f"prep's compiled MinHash kernel ready in {time.perf_counter() - start:.2f} s (not timed below)", file=sys.stderr)
    start = time.perf_counter()
    case_table()
    print(f"prep's case table built in {time.perf_counter() - start:.2f} s (not timed below)", file=sys.stderr)
    texts = draw(read_texts(args.corpus or corpus(args.workdir, 100)), int(args.mb * 1e6))
    batches = make_batches(texts, args.ngram)
    check_same_shingles(batches)
    sample = make_batches(draw(texts, int(args.datasketch_mb * 1e6)), args.ngram)
    results = run_rounds(batches, sample, args)
    report(results, batches, sample, args)


def _peers_importable() -> bool:
    try:
        import datasketch  # noqa: F401
        import rensa  # noqa: F401
    except ImportError:
        return False
    return True


def _rerun_in(venv: Path) -> None:
    """Run this script again with `venv`'s Python (made and filled when missing)."""
    if venv.resolve() == Path(sys.prefix).resolve():
        raise SystemExit(f"--venv {venv} lacks datasketch or rensa even after installing them")
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making {venv} for datasketch and rensa", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import datasketch, rensa, xxhash, numba"], capture_output=True)
    if probe.returncode:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(REPO)], check=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sys.exit(subprocess.run([str(python), "-m", "tests.bench.bench_minhash", *sys.argv[1:]], cwd=REPO, env=env).returncode)


def read_texts(folder: Path) -> list[bytes]:
    """Every document of the corpus (files in name order), as UTF-8."""
    texts: list[bytes] = []
    for path in sorted(folder.glob("*.jsonl")):
        with open(path, encoding="utf-8") as lines:
            texts.extend(json.loads(line)["text"].encode("utf-8") for line in lines)
    return texts


def draw(texts: list[bytes], target: int) -> list[bytes]:
    """Whole documents drawn with a fixed seed until they hold `target` bytes, in corpus order."""
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    chosen, total = [], 0
    for index in order:
        if total >= target:
            break
        chosen.append(index)
        total += len(texts[index])
    return [texts[index] for index in sorted(chosen)]


def make_batches(texts: list[bytes], ngram: int) -> list[Batch]:
    """`texts` in tokenize-sized batches, with everything each side starts from."""
    batches, start = [], 0
    while start < len(texts):
        end, size = start, 0
        while end < len(texts) and end - start < BATCH_DOCUMENTS and (end == start or size + len(texts[end]) <= BATCH_TEXT_BYTES):
            size += len(texts[end])
            end += 1
        chunk = texts[start:end]
        offsets = np.zeros(len(chunk) + 1, dtype=np.int64)
        np.cumsum([len(text) for text in chunk], out=offsets[1:])
        blob = b"".join(chunk)
        hashes, bounds = shingle_hashes(blob, offsets, ngram)
        batches.append(Batch(blob, offsets, shingle_strings(chunk, ngram), hashes, bounds))
        start = end
    return batches


def shingle_strings(texts: Sequence[bytes], ngram: int) -> list[list[str]]:
    """Each text's shingles as strings, by prep's definitions in plain Python (what a peer's user writes)."""
    result = []
    for text in texts:
        words = unicodedata.normalize("NFC", text.decode("utf-8")).lower().split()
        if len(words) < ngram:
            result.append([" ".join(words)] if words else [])
        else:
            result.append([" ".join(words[i:i + ngram]) for i in range(len(words) - ngram + 1)])
    return result


def check_same_shingles(batches: list[Batch]) -> None:
    """Every document has as many distinct shingles on both sides (64-bit collisions aside)."""
    for batch in batches:
        bounds = batch.bounds.tolist()
        for index, shingles in enumerate(batch.shingles):
            ours = len(np.unique(batch.hashes[bounds[index]:bounds[index + 1]]))
            if ours != len(set(shingles)):
                raise SystemExit(f"document {index}: {ours} distinct shingles in prep, {len(set(shingles))} as strings")


def sides(args: argparse.Namespace) -> dict[str, Callable[[list[Batch]], object]]:
    """Each side's work over a list of batches."""
    import datasketch
    import rensa

    permutations, ngram, seed = args.permutations, args.ngram, 0
    family = hash_family(seed, permutations)

    def texts_of(batch: Batch) -> list[bytes]:
        bounds = batch.offsets.tolist()
        return [batch.blob[start:end] for start, end in zip(bounds[:-1], bounds[1:])]

    return {
        "prep": lambda batches: [signatures(b.blob, b.offsets, ngram, permutations, seed) for b in batches],
        "prep core": lambda batches: [minhash(b.hashes, b.bounds, family) for b in batches],
        "prep, numpy text path": lambda batches: [minhash(*shingle_hashes(b.blob, b.offsets, ngram), family)
                                                  for b in batches],
        "prep, numpy": lambda batches: [numpy_minhash(*shingle_hashes(b.blob, b.offsets, ngram), family)
                                        for b in batches],
        "prep core, numpy": lambda batches: [numpy_minhash(b.hashes, b.bounds, family) for b in batches],
        "shingling": lambda batches: [shingle_strings(texts_of(b), ngram) for b in batches],
        "rensa": lambda batches: [rensa.RMinHash.digest_matrix_from_token_sets(b.shingles, permutations, seed)
                                  for b in batches],
        "rensa core": lambda batches: [rensa.RMinHash.digest_matrix_from_flat_token_hashes(
            b.hashes, b.bounds.astype(np.uint64), permutations, seed) for b in batches],
        "datasketch": lambda batches: [datasketch.MinHash.bulk([[s.encode() for s in doc] for doc in b.shingles],
                                                               num_perm=permutations) for b in batches],
    }


def run_rounds(batches: list[Batch], sample: list[Batch], args: argparse.Namespace) -> dict[tuple[str, str], list[float]]:
    """CPU seconds of every side on the whole text and on the sample, per round, sides alternated."""
    work = sides(args)
    plan = [(name, "all") for name in work if name != "datasketch"] + \
        [(name, "sample") for name in ("prep", "shingling", "datasketch")]
    times: dict[tuple[str, str], list[float]] = {key: [] for key in plan}
    for round_number in range(args.rounds):
        for name, part in (plan if round_number % 2 == 0 else plan[::-1]):
            start = time.process_time()
            work[name](batches if part == "all" else sample)
            times[name, part].append(time.process_time() - start)
        line = ", ".join(f"{name} ({part}) {values[-1]:.2f} s" for (name, part), values in times.items())
        print(f"round {round_number + 1}: {line}", file=sys.stderr, flush=True)
    return times


def report(times: dict[tuple[str, str], list[float]], batches: list[Batch], sample: list[Batch],
           args: argparse.Namespace) -> None:
    """Each side's median rate, then the ratios that count."""
    sizes = {part: (sum(len(b.blob) for b in group), sum(len(b.offsets) - 1 for b in group),
                    sum(len(b.hashes) for b in group)) for part, group in (("all", batches), ("sample", sample))}
    median = {key: statistics.median(values) for key, values in times.items()}
    print(f"rensa {importlib.metadata.version('rensa')}, datasketch {importlib.metadata.version('datasketch')}")
    print(f"{sizes['all'][0] / 1e6:.1f} MB, {sizes['all'][1]:,} documents, {sizes['all'][2]:,} shingles "
          f"(datasketch's sample: {sizes['sample'][0] / 1e6:.1f} MB, {sizes['sample'][1]:,} documents); "
          f"{args.permutations} permutations, {args.ngram}-word shingles, medians of {args.rounds} rounds")
    print(f"{'side':<22} {'CPU s':>8} {'MB/s':>8} {'signatures/s':>13} {'shingles/s':>12}")
    for (name, part), seconds in median.items():
        size, documents, shingles = sizes[part]
        print(f"{name + (' (sample)' if part == 'sample' else ''):<22} {seconds:>8.3f} {size / 1e6 / seconds:>8.2f} "
              f"{documents / seconds:>13,.0f} {shingles / seconds:>12,.0f}")
    prep = median["prep", "all"]
    print(f"shingling + rensa / prep: {(median['shingling', 'all'] + median['rensa', 'all']) / prep:.2f}")
    print(f"rensa (shingles given) / prep: {median['rensa', 'all'] / prep:.2f}")
    print(f"rensa core / prep core: {median['rensa core', 'all'] / median['prep core', 'all']:.3f}")
    print(f"prep, numpy text path / prep: {median['prep, numpy text path', 'all'] / prep:.2f}; "
          f"prep, numpy / prep: {median['prep, numpy', 'all'] / prep:.2f}; "
          f"prep core, numpy / prep core: {median['prep core, numpy', 'all'] / median['prep core', 'all']:.2f}")
    sampled, peer = median["prep", "sample"], median["shingling", "sample"] + median["datasketch", "sample"]
    print(f"shingling + datasketch / prep (sample): {peer / sampled:.2f}")
    print(f"datasketch (shingles given) / prep (sample): {median['datasketch', 'sample'] / sampled:.2f}")


if __name__ == "__main__":
    main()
