"""datatrove's side of tests/bench/bench_neardup.py: its MinHash deduplication pipeline, run by that
benchmark with the Python of a virtualenv holding datatrove (never prep's environment: it imports
nothing of prep).

    VENV/bin/python tests/bench/neardup_peer.py CORPUS_DIR WORK_DIR --workers 2
        [--buckets 14] [--rows 8] [--ngram 5]

The four stages of datatrove's examples/minhash_deduplication.py, one `LocalPipelineExecutor` each,
run one after another: signatures (a JsonlReader over CORPUS_DIR's `*.jsonl`, one task a file,
then `MinhashDedupSignature`), buckets (`MinhashDedupBuckets`, one task a bucket), clusters
(`MinhashDedupCluster`, one task, with `save_cluster_id` so the benchmark can read the clusters)
and filter (the reader again, `MinhashDedupFilter`, a `JsonlWriter` without compression), every
executor with `--workers` workers, started by fork (its default, forkserver, leaves the workers
outside the process's reaped children, so the benchmark's CPU seconds would miss them). Prints one
JSON line on stdout: each stage's wall seconds, the documents the filter read and dropped, the
versions. WORK_DIR is emptied first; the clusters stay in WORK_DIR/remove_ids
(`{rank:06d}.clusters`: (document index, cluster id) uint32 pairs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=14)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--ngram", type=int, default=5)
    args = parser.parse_args()
    replies = sys.stdout
    sys.stdout = sys.stderr  # anything a library prints must not mix with the reply
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    seconds, stats = run(args)
    versions = {name: metadata.version(name) for name in ("datatrove", "spacy", "xxhash", "numpy")}
    replies.write(json.dumps({"seconds": seconds, "stats": stats, "versions": versions,
                              "python": sys.version.split()[0]}) + "\n")


def run(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, int]]:
    """The four stages in order, each timed; the filter's documents read and dropped."""
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers.jsonl import JsonlWriter

    config = MinhashConfig(n_grams=args.ngram, num_buckets=args.buckets, hashes_per_bucket=args.rows)
    files = len(list(args.corpus.glob("*.jsonl")))
    work, corpus = args.work, str(args.corpus)

    def reader() -> JsonlReader:
        return JsonlReader(corpus, glob_pattern="*.jsonl", text_key="text", id_key="id")

    stages = {
        "signatures": ([reader(), MinhashDedupSignature(output_folder=str(work / "signatures"), config=config)], files),
        "buckets": ([MinhashDedupBuckets(input_folder=str(work / "signatures"), output_folder=str(work / "buckets"),
                                         config=config)], args.buckets),
        "clusters": ([MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"),
                                          config=config, save_cluster_id=True)], 1),
        "filter": ([reader(), MinhashDedupFilter(input_folder=str(work / "remove_ids")),
                    JsonlWriter(str(work / "output"), compression=None)], files),
    }
    seconds: dict[str, float] = {}
    for name, (pipeline, tasks) in stages.items():
        executor = LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(args.workers, tasks),
                                         logging_dir=str(work / "logs" / name), start_method="fork")
        started = time.perf_counter()
        executor.run()
        seconds[name] = time.perf_counter() - started
        print(f"datatrove {name}: {seconds[name]:.1f} s", file=sys.stderr, flush=True)
    stats = _filter_stats(work / "logs" / "filter" / "stats.json")
    return seconds, stats


def _filter_stats(path: Path) -> dict[str, int]:
    """Documents the filter stage read and dropped, from its merged stats file."""
    found = {"total": 0, "dropped": 0}
    for step in json.loads(path.read_text()):
        if "Filter" in str(step.get("name", "")) or "stage 4" in str(step.get("name", "")):
            for key in found:
                value = step.get("stats", {}).get(key, 0)
                found[key] = int(value["total"] if isinstance(value, dict) else value)
    return found


if __name__ == "__main__":
    main()
