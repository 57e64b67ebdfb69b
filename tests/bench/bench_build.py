"""Benchmark (not a test): `prep build` against the tokenizer's own ceiling, side by side.

    python -m tests.bench.bench_build [--sizes 100,400] [--workdir /tmp/prep-bench]

Ceiling: `tokenizers`' Tokenizer.encode_batch_fast over the same texts already in memory, all
cores (only the encode call is timed). Build: `prep build` with the reference backend
(`backend = "tokenizers"`), --workers = cores, start-up included, fresh store. Prints MB/s of
text, tokens/s, peak RSS of the whole process tree and the ratio build/ceiling, for each corpus
scale (the RSS column shows whether memory grows with corpus size).
"""

from __future__ import annotations

import json
import shutil
import sys

from tests.bench.benchsupport import corpus_bytes, measure, pipeline, prep_build, setup

CEILING = r"""
import json, sys, time
from pathlib import Path
from tokenizers import Tokenizer
texts = [json.loads(line)["text"] for p in sorted(Path(sys.argv[1]).glob("*.jsonl")) for line in open(p, encoding="utf-8")]
tok = Tokenizer.from_file(sys.argv[2]); tok.encode_special_tokens = True
started = time.perf_counter()
encodings = tok.encode_batch_fast(texts, add_special_tokens=False)
print(json.dumps({"seconds": time.perf_counter() - started, "tokens": sum(len(e.ids) for e in encodings)}))
"""


def main() -> None:
    bench = setup(__doc__, "100,400")
    print(f"{'corpus':>8} {'what':<22} {'seconds':>8} {'MB/s':>7} {'Mtok/s':>7} {'peak RSS':>9} {'ratio':>6}")
    for folder in bench.corpora:
        text_bytes = corpus_bytes(folder)
        ceiling = measure([sys.executable, "-c", CEILING, str(folder), str(bench.tokenizer)])
        figures = json.loads(ceiling.stdout)
        store = bench.workdir / "store-bench"
        shutil.rmtree(store, ignore_errors=True)
        build = prep_build(pipeline(bench.workdir, folder, bench.tokenizer, "tokenizers"), store, bench.workers)
        tokens = figures["tokens"]
        label = f"{text_bytes / 1e6:.0f}MB"
        print(f"{label:>8} {'ceiling encode_batch':<22} {figures['seconds']:8.2f} {text_bytes / figures['seconds'] / 1e6:7.2f} "
              f"{tokens / figures['seconds'] / 1e6:7.3f} {ceiling.peak_rss / 2**20:8.0f}M {'':>6}")
        print(f"{label:>8} {'prep build':<22} {build.seconds:8.2f} {text_bytes / build.seconds / 1e6:7.2f} "
              f"{tokens / build.seconds / 1e6:7.3f} {build.peak_rss / 2**20:8.0f}M {figures['seconds'] / build.seconds:6.2f}",
              flush=True)


if __name__ == "__main__":
    main()
