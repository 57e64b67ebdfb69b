"""Benchmark (not a test): near-duplicate removal (`[dedup.near]`, issue 42) against datatrove's
MinHash pipeline and rensa's signatures, side by side in one run, and its clusters against the
exact all-pairs Jaccard.

    python -m tests.bench.bench_neardup [--docs 1,4] [--real-mb 300] [--datatrove real,1] [--plain all]
        [--near "key = value; ... | ..."] [--sample 20000] [--ceiling-mb 20] [--workers 2] [--workdir /tmp/prep-bench]
        [--venv /tmp/dtenv] [--minhash-venv /tmp/minhash-venv]

Corpora: `--docs` millions of short documents (50-200 words each, words drawn independently from
the word frequencies of the 100 MB real-text corpus, the 50,000 commonest; 10% of the documents
are planted near duplicates: a copy of one of the 5,000 documents before it, each word replaced by
a fresh one with probability 0 to 1.1% for half of them and 1.1 to 12% for the other half, so true
5-gram Jaccard about 0.55 to 1, copies of copies making chains), JSON Lines of 1M documents a file
(at least 4 files), made once under the workdir; and the `--real-mb` real-text corpus
(../shared/bench/make_corpus.py).

For each corpus, in this order: `prep build` without near-dup (gigatoken backend, formats
["bin"], exact dedup on, --workers, fresh store; for the corpora `--plain` names), the same with `[dedup.near]` at its defaults
(threshold 0.8, 5-word shingles, 128 permutations as 8 bands of 16 rows, seed 0) or `--near`'s
settings (several, separated by `|`, each a near build, each printed with its CPU over the
first's: `--near " | verify = true"` weighs the defaults against `verify` and its 16 x 8), and, for the
corpora `--datatrove` names, datatrove's four MinHash stages (tests/bench/neardup_peer.py in
--venv: signatures, buckets, clusters, filter; 5-word shingles, its default 14 buckets of 8
hashes = 112 permutations, 64-bit, xxhash; same --workers; a run of datatrove on a million short
documents takes about an hour of CPU). Each is one process tree sampled every 50 ms: wall and CPU
seconds (every process), documents per wall second and per CPU second (the per-core figure), peak
RSS (VmHWM) of the driver and of the largest other process (a worker), each stage's seconds. The
ratios that count: datatrove's CPU (and wall) over prep's near build, and over prep's near-dup cost
alone (near build minus plain build); the 4M / 1M peaks of each role.

Ceiling (`--ceiling-mb` MB of each corpus): tests/bench/bench_minhash.py on the same corpus
(`--corpus`): prep's signatures against rensa's and datasketch's from the same text.

Quality (`--sample` documents, made like the short corpus, one file): the exact Jaccard of every
pair of documents that share a 5-gram shingle (prep's shingle hashes, an inverted index) defines
the true pairs (Jaccard >= 0.8); prep's clusters (the build's drops object: each dropped document
with its kept one), at the defaults, with `verify = true` (16 bands of 8 rows) and with datatrove's
banding (112 permutations as 14 bands of 8 rows, without and with `verify`), and datatrove's (its
`.clusters` file) are compared with them pair by pair (every pair in one cluster), and with the
connected components of the true pairs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from prep.neardup.signatures import shingle_sets
from prep.workfiles.drops import DROPS, open_drops
from tests.bench.bench_scale import build, text_bytes, write_pipeline
from tests.bench.bench_steps import DATATROVE, ensure_venv
from tests.bench.benchsupport import REPO, TreeRun, corpus, measure_tree, stage_seconds, tokenizer
from tests.neardup.unionfind import clusters

Array = np.ndarray[Any, Any]
WORDS = 50_000
MIN_WORDS, MAX_WORDS = 50, 200
PLANTED, REACH = 0.10, 5_000
DOCS_PER_FILE, MIN_FILES, CHUNK = 1_000_000, 4, 100_000
THRESHOLD, NGRAM = 0.8, 5
PEER = Path(__file__).with_name("neardup_peer.py")
MATCHED = "permutations = 112\nbands = 14\nrows = 8\n"
"""prep's settings closest to datatrove's defaults (14 buckets of 8 hashes)."""


def vocabulary(workdir: Path) -> tuple[list[str], Array]:
    """The `WORDS` commonest words of the 100 MB real-text corpus and their frequencies (made once)."""
    cached = workdir / "near-vocabulary.json"
    if not cached.exists():
        counts: collections.Counter[str] = collections.Counter()
        for path in sorted(corpus(workdir, 100).glob("*.jsonl")):
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    counts.update(json.loads(line)["text"].split())
        cached.write_text(json.dumps(counts.most_common(WORDS), ensure_ascii=False))
    pairs = json.loads(cached.read_text())
    weights = np.array([count for _, count in pairs], dtype=np.float64)
    return [word for word, _ in pairs], np.cumsum(weights) / weights.sum()


def near_corpus(workdir: Path, documents: int, files: int | None = None) -> Path:
    """`documents` short documents with planted near duplicates (made once, reused)."""
    out = workdir / f"near-{documents}"
    files = files or max(MIN_FILES, -(-documents // DOCS_PER_FILE))
    if len(list(out.glob("*.jsonl"))) == files:
        return out
    staging = workdir / f"near-{documents}.tmp"
    for stale in (out, staging):
        shutil.rmtree(stale, ignore_errors=True)
    staging.mkdir(parents=True)
    words, cdf = vocabulary(workdir)
    lexicon = np.array(words, dtype=object)
    rng = np.random.default_rng(documents)
    per = -(-documents // files)
    for index in range(files):
        first, count = index * per, min(per, documents - index * per)
        with open(staging / f"part-{index:05d}.jsonl", "w", encoding="utf-8") as handle:
            for start in range(0, count, CHUNK):
                texts = short_texts(rng, min(CHUNK, count - start), lexicon, cdf)
                handle.writelines(json.dumps({"id": f"n{first + start + k:010d}", "text": text}, ensure_ascii=False)
                                  + "\n" for k, text in enumerate(texts))
    staging.rename(out)
    return out


def short_texts(rng: np.random.Generator, count: int, lexicon: Array, cdf: Array) -> list[str]:
    """`count` documents of random words, `PLANTED` of them edited copies of one shortly before."""
    lengths = rng.integers(MIN_WORDS, MAX_WORDS + 1, size=count)
    ids = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), len(cdf) - 1)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    copies = (rng.random(count) < PLANTED).tolist()
    texts: list[str] = []
    for k in range(count):
        if copies[k] and k:
            source = int(rng.integers(max(0, k - REACH), k))
            rate = rng.uniform(0, 0.011) if rng.random() < 0.5 else rng.uniform(0.011, 0.12)
            texts.append(edited(rng, texts[source], rate))
        else:
            texts.append(" ".join(lexicon[ids[bounds[k]:bounds[k + 1]]].tolist()))
    return texts


def edited(rng: np.random.Generator, text: str, rate: float) -> str:
    """`text` with each word replaced by a fresh one (not in the vocabulary) with probability `rate`."""
    words = text.split(" ")
    for at in np.flatnonzero(rng.random(len(words)) < rate).tolist():
        words[at] = f"x{int(rng.integers(1 << 40)):x}"
    return " ".join(words)


def near_pipeline(workdir: Path, folder: Path, tok: Path, near: str | None) -> Path:
    """bench_scale's gigatoken pipeline (formats ["bin"]) over `folder`, with a `[dedup.near]` table
    of the settings `near` (TOML lines; "" for the defaults) unless it is None."""
    spec_dir = workdir / f"spec-{folder.name}-{'plain' if near is None else 'near'}"  # one a corpus: runs may overlap
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = write_pipeline(spec_dir, folder, tok, ["bin"])
    if near is not None:
        spec.write_text(spec.read_text() + "[dedup.near]\n" + near)
    return spec


def datatrove(python: Path, folder: Path, work: Path, workers: int) -> tuple[TreeRun, dict[str, Any]]:
    """datatrove's four MinHash stages over `folder`, measured; its reply."""
    run = measure_tree([str(python), str(PEER), str(folder), str(work), "--workers", str(workers)], cwd=work.parent)
    reply: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return run, reply


def megabytes(value: int) -> str:
    return f"{value / 2**20:.0f}"


def row(label: str, what: str, run: TreeRun, documents: int, nbytes: int) -> None:
    """One printed result line: wall and CPU seconds, documents per wall second and per CPU second
    (per core: what a shared machine moves least), MB/s, peaks by role."""
    print(f"{label:>6} {what:<24} {run.seconds:8.1f} {run.cpu_seconds:8.1f} {documents / run.seconds / 1e3:9.2f}k "
          f"{documents / run.cpu_seconds / 1e3:9.2f}k {nbytes / run.seconds / 1e6:6.2f} "
          f"{megabytes(run.driver_rss):>7}M {megabytes(run.worker_rss):>7}M {megabytes(run.peak_rss):>7}M "
          f"{run.processes:>4}", flush=True)


def near_summary(stderr: str) -> str:
    """The near stages' closing lines (candidate pairs; duplicates and clusters) and the order stage's."""
    stages = ("near_buckets", "near_clusters", "order")
    return "; ".join(line.split("] ", 1)[1] for line in stderr.splitlines()
                     if ": done in" in line and any(f"] {stage}:" in line for stage in stages))


def compare(args: argparse.Namespace, label: str, folder: Path, tok: Path, dt_python: Path | None,
            plain: bool) -> dict[str, TreeRun]:
    """The plain build (when `plain`), the near build and (when asked) datatrove on one corpus, printed."""
    documents, nbytes = text_bytes(folder)
    runs: dict[str, TreeRun] = {}
    store = args.workdir / f"store-neardup-{folder.name}"
    builds: list[tuple[str, str | None]] = [("plain", None)] if plain else []
    for index, text in enumerate(args.near.split("|")):
        lines = "".join(f"{item.strip()}\n" for item in text.split(";") if item.strip())
        builds.append(("near" if index == 0 else f"near {text.strip()}", lines))
    for name, settings in builds:
        shutil.rmtree(store, ignore_errors=True)
        run = build(near_pipeline(args.workdir, folder, tok, settings), store, args.workers)
        runs[name] = run
        row(label, "prep build" if settings is None else f"prep build + {name}", run, documents, nbytes)
        print(f"       stages (s): {json.dumps(stage_seconds(run.stderr))}", flush=True)
        if settings is not None:
            print(f"       {near_summary(run.stderr)}", flush=True)
        if name not in ("plain", "near"):
            print(f"       CPU {name} / near (the first settings): {run.cpu_seconds / runs['near'].cpu_seconds:.2f}",
                  flush=True)
    shutil.rmtree(store, ignore_errors=True)
    if dt_python is not None:
        run, reply = datatrove(dt_python, folder, args.workdir / f"datatrove-{folder.name}", args.workers)
        runs["datatrove"] = run
        row(label, "datatrove minhash", run, documents, nbytes)
        print(f"       stages (s): {json.dumps({k: round(v, 1) for k, v in reply['seconds'].items()})}; "
              f"filter {json.dumps(reply['stats'])}; {json.dumps(reply['versions'])}", flush=True)
        shutil.rmtree(args.workdir / f"datatrove-{folder.name}", ignore_errors=True)
    ratios(runs)
    return runs


def ratios(runs: dict[str, TreeRun]) -> None:
    """Near-dup's added cost (near build minus plain build) and datatrove's time over prep's, printed."""
    near = runs["near"]
    if "plain" in runs:
        plain = runs["plain"]
        added, added_cpu = near.seconds - plain.seconds, near.cpu_seconds - plain.cpu_seconds
        print(f"       near-dup's added cost: {added:.1f} s wall ({added / plain.seconds:.0%} of the plain build), "
              f"{added_cpu:.1f} s CPU ({added_cpu / plain.cpu_seconds:.0%})", flush=True)
    if "datatrove" in runs:
        peer = runs["datatrove"]
        line = (f"datatrove / prep near build: wall {peer.seconds / near.seconds:.2f}, "
                f"CPU {peer.cpu_seconds / near.cpu_seconds:.2f}")
        if "plain" in runs:  # the added cost is a difference: noise can make it small or negative
            line += (f"; datatrove / prep's added cost: wall {_ratio(peer.seconds, added)}, "
                     f"CPU {_ratio(peer.cpu_seconds, added_cpu)}")
        print(f"       {line}", flush=True)


def _ratio(peer: float, prep: float) -> str:
    return f"{peer / prep:.2f}" if prep > 0 else "n/a (no added cost measured)"


def ceiling(args: argparse.Namespace, label: str, folder: Path) -> None:
    """bench_minhash on `args.ceiling_mb` MB of `folder`: prep's signatures against rensa and datasketch."""
    command = [sys.executable, "-m", "tests.bench.bench_minhash", "--corpus", str(folder), "--mb", str(args.ceiling_mb),
               "--datasketch-mb", str(max(1.0, args.ceiling_mb / 10)), "--rounds", "3", "--venv", str(args.minhash_venv)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode:
        raise SystemExit(f"bench_minhash failed: {done.stderr[-2000:]}")
    print(f"ceiling, {label}: bench_minhash --corpus {folder} --mb {args.ceiling_mb}")
    print("\n".join(f"       {line}" for line in done.stdout.strip().splitlines()), flush=True)


def true_pairs(sets: list[Array]) -> tuple[Array, Array]:
    """Every pair (as `left * n + right`, left < right) of documents sharing a shingle, and its
    exact Jaccard: an inverted index from shingle hash to documents."""
    n = len(sets)
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    hashes = np.concatenate(sets)
    owners = np.repeat(np.arange(n, dtype=np.int64), sizes)
    order = np.argsort(hashes, kind="stable")
    hashes, owners = hashes[order], owners[order]
    starts = np.flatnonzero(np.concatenate([[True], hashes[1:] != hashes[:-1], [True]]))
    shared_by = np.flatnonzero(np.diff(starts) > 1)
    codes = []
    for start, end in zip(starts[shared_by].tolist(), starts[shared_by + 1].tolist()):
        members = owners[start:end]
        left, right = np.triu_indices(end - start, 1)
        codes.append(members[left] * n + members[right])
    pairs, shared = np.unique(np.concatenate(codes), return_counts=True) if codes else (np.zeros(0, np.int64),) * 2
    left, right = pairs // n, pairs % n
    return pairs, shared / (sizes[left] + sizes[right] - shared)


def cluster_pairs(labels: Array) -> Array:
    """Every pair (`left * n + right`, left < right) of documents with the same label."""
    n = len(labels)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_labels[1:] != sorted_labels[:-1], [True]]))
    codes = [np.zeros(0, dtype=np.int64)]
    for start, end in zip(starts[:-1].tolist(), starts[1:].tolist()):
        if end - start > 1:
            members = np.sort(order[start:end]).astype(np.int64)
            left, right = np.triu_indices(end - start, 1)
            codes.append(members[left] * n + members[right])
    return np.unique(np.concatenate(codes))


def prep_labels(args: argparse.Namespace, folder: Path, tok: Path, n: int, near: str) -> Array:
    """Each document's cluster (its kept document's index) from the drops object of a near build
    with the settings `near`."""
    store = args.workdir / "store-neardup-quality"
    shutil.rmtree(store, ignore_errors=True)
    build(near_pipeline(args.workdir, folder, tok, near), store, args.workers)
    found = [path for path in (store / "objects").rglob("*") if path.is_file() and path.open("rb").read(8) == DROPS.magic]
    if len(found) != 1:
        raise SystemExit(f"expected one drops object in {store}, found {len(found)}")
    records = open_drops(found[0]).read_all()
    labels = np.arange(n, dtype=np.int64)
    documents, kept = records["document"].astype(np.int64), records["representative"].astype(np.int64)
    if (documents >> 32).any() or (kept >> 32).any():
        raise SystemExit("the quality sample must be one part")
    labels[documents] = kept
    shutil.rmtree(store, ignore_errors=True)
    return labels


def datatrove_labels(python: Path, folder: Path, work: Path, workers: int, n: int) -> Array:
    """Each document's cluster from datatrove's `.clusters` file (documents in no cluster alone)."""
    datatrove(python, folder, work, workers)
    pairs = np.fromfile(work / "remove_ids" / "000000.clusters", dtype="<u4").reshape(-1, 2).astype(np.int64)
    labels = np.arange(n, dtype=np.int64)
    labels[pairs[:, 0]] = n + pairs[:, 1]
    shutil.rmtree(work, ignore_errors=True)
    return labels


def quality(args: argparse.Namespace, tok: Path, dt_python: Path | None) -> None:
    """Precision and recall of prep's and datatrove's clusters against the exact all-pairs Jaccard."""
    folder = near_corpus(args.workdir, args.sample, files=1)
    texts = [json.loads(line)["text"].encode("utf-8") for line in (next(folder.glob("*.jsonl"))).open(encoding="utf-8")]
    n = len(texts)
    offsets = np.concatenate([[0], np.cumsum([len(text) for text in texts])]).astype(np.int64)
    started = time.perf_counter()
    pairs, jaccard = true_pairs(shingle_sets(b"".join(texts), offsets, NGRAM))
    truth = pairs[jaccard >= THRESHOLD]
    components = clusters(truth // n, truth % n)
    component_labels = np.arange(n, dtype=np.int64)
    component_labels[components.documents] = components.representatives
    closure = cluster_pairs(component_labels)
    print(f"quality: {n:,} documents, {len(pairs):,} pairs share a shingle, {len(truth):,} at Jaccard >= {THRESHOLD} "
          f"({int((jaccard >= 0.9).sum()):,} >= 0.9), {len(closure):,} pairs in their connected components "
          f"(exact all-pairs in {time.perf_counter() - started:.1f} s)", flush=True)
    sides = {"prep": prep_labels(args, folder, tok, n, ""),
             "prep verify": prep_labels(args, folder, tok, n, "verify = true\n"),
             "prep 14x8": prep_labels(args, folder, tok, n, MATCHED),
             "prep 14x8 verify": prep_labels(args, folder, tok, n, MATCHED + "verify = true\n")}
    if dt_python is not None:
        sides["datatrove"] = datatrove_labels(dt_python, folder, args.workdir / "datatrove-quality", args.workers, n)
    high = pairs[jaccard >= 0.9]
    low = set(pairs[jaccard >= 0.5].tolist())
    for name, labels in sides.items():
        found = cluster_pairs(labels)
        hits = np.intersect1d(found, truth).size
        closed = np.intersect1d(found, closure).size
        dissimilar = found.size - np.intersect1d(found, np.fromiter(low, dtype=np.int64)).size
        print(f"  {name:<16} {found.size:,} pairs in {len(np.unique(labels[labels != np.arange(n)])):,} clusters; "
              f"pairs at >= {THRESHOLD}: precision {hits / max(found.size, 1):.4f}, recall {hits / max(truth.size, 1):.4f}; "
              f"against the components: precision {closed / max(found.size, 1):.4f}, recall {closed / max(closure.size, 1):.4f}; "
              f"recall at >= 0.9 {np.intersect1d(found, high).size / max(high.size, 1):.4f}; "
              f"pairs in one cluster with Jaccard < 0.5: {dissimilar:,}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", default="1,4", help="short corpora in millions of documents, comma-separated")
    parser.add_argument("--real-mb", type=int, default=300, help="the real-text corpus in MB (0: none)")
    parser.add_argument("--datatrove", default="real,1", help="corpora datatrove runs on too: real and/or --docs sizes")
    parser.add_argument("--plain", default="all", help="corpora also built without near-dup: all, or as --datatrove")
    parser.add_argument("--near", default="", help='the near builds\' [dedup.near] settings, "key = value; ...", '
                        'several separated by "|" (default: none, the defaults; the quality sample uses its own)')
    parser.add_argument("--sample", type=int, default=20_000, help="documents of the quality sample (0: none)")
    parser.add_argument("--ceiling-mb", type=float, default=20, help="MB of each corpus bench_minhash signs (0: none)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--venv", type=Path, default=Path("/tmp/dtenv"), help="datatrove's virtualenv")
    parser.add_argument("--minhash-venv", type=Path, default=Path("/tmp/minhash-venv"), help="rensa's and datasketch's")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(corpus(args.workdir, 100), args.workdir / "tokenizer-50257.json")
    wanted = set(args.datatrove.split(",")) if args.datatrove else set()
    dt_python = ensure_venv(args.venv, DATATROVE, ("orjson",)) if wanted or args.sample else None
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}, {args.workers} workers", flush=True)
    corpora = [(f"{size}M", near_corpus(args.workdir, int(float(size) * 1e6)), size) for size in args.docs.split(",") if size]
    if args.real_mb:
        corpora.append((f"{args.real_mb}MB", corpus(args.workdir, args.real_mb), "real"))
    print(f"{'corpus':>6} {'what':<24} {'wall s':>8} {'CPU s':>8} {'docs/s':>10} {'docs/CPUs':>10} {'MB/s':>6} "
          f"{'driver':>8} {'worker':>8} {'tree':>8} {'procs':>4}")
    near_runs: dict[str, TreeRun] = {}
    for label, folder, key in corpora:
        plain = args.plain == "all" or key in args.plain.split(",")
        near_runs[label] = compare(args, label, folder, tok, dt_python if key in wanted else None, plain)["near"]
    shorts = [label for label, _, key in corpora if key != "real"]
    for smaller, larger in zip(shorts, shorts[1:]):
        a, b = near_runs[smaller], near_runs[larger]
        print(f"memory {larger} / {smaller} (near build): driver {b.driver_rss / a.driver_rss:.2f}, largest worker "
              f"{b.worker_rss / a.worker_rss:.2f}, tree {b.peak_rss / a.peak_rss:.2f}; wall {b.seconds / a.seconds:.2f}",
              flush=True)
    if args.ceiling_mb:
        for label, folder, _ in corpora[:1] + corpora[-1:]:
            ceiling(args, label, folder)
    if args.sample:
        quality(args, tok, dt_python)


if __name__ == "__main__":
    main()
