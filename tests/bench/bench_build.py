"""Benchmark (not a test): `prep build` against the tokenizer's own ceiling, side by side.

    python -m tests.bench.bench_build [--sizes 100,400] [--workdir /tmp/prep-bench]

Ceiling: `tokenizers`' Tokenizer.encode_batch_fast over the same texts already in memory, all
cores (only the encode call is timed). Build: `prep build` with the reference backend
(`backend = "tokenizers"`), --workers = cores, start-up included, fresh store. Prints MB/s of
text, tokens/s, peak RSS of the whole process tree and the ratio build/ceiling, for each corpus
scale (the RSS column shows whether memory grows with corpus size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from tests.bench.benchsupport import corpus, corpus_bytes, measure, pipeline, prep_build, tokenizer

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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,400",
                        help="corpus sizes in MB, comma-separated (this machine holds ~470 MB of distinct text)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(corpus(args.workdir / "corpus-100", 100), args.workdir / "tokenizer-50257.json")
    print(f"{'corpus':>8} {'what':<22} {'seconds':>8} {'MB/s':>7} {'Mtok/s':>7} {'peak RSS':>9} {'ratio':>6}")
    for mb in [int(s) for s in args.sizes.split(",")]:
        folder = corpus(args.workdir / f"corpus-{mb}", mb)
        text_bytes = corpus_bytes(folder)
        ceiling = measure([sys.executable, "-c", CEILING, str(folder), str(tok)])
        figures = json.loads(ceiling.stdout)
        store = args.workdir / "store-bench"
        shutil.rmtree(store, ignore_errors=True)
        build = prep_build(pipeline(args.workdir, folder, tok, "tokenizers"), store, args.workers)
        tokens = figures["tokens"]
        label = f"{text_bytes / 1e6:.0f}MB"
        print(f"{label:>8} {'ceiling encode_batch':<22} {figures['seconds']:8.2f} {text_bytes / figures['seconds'] / 1e6:7.2f} "
              f"{tokens / figures['seconds'] / 1e6:7.3f} {ceiling.peak_rss / 2**20:8.0f}M {'':>6}")
        print(f"{label:>8} {'prep build':<22} {build.seconds:8.2f} {text_bytes / build.seconds / 1e6:7.2f} "
              f"{tokens / build.seconds / 1e6:7.3f} {build.peak_rss / 2**20:8.0f}M {figures['seconds'] / build.seconds:6.2f}",
              flush=True)


if __name__ == "__main__":
    main()
