"""Benchmark (not a test): a worker's memory on a corpus whose vocabulary never stops growing.

    python -m tests.bench.bench_vocab [--documents 1.5] [--workdir /tmp/prep-bench] [--workers 2]

gigatoken caches every distinct pre-token it has encoded, without a bound. The corpus here is
DOCUMENTS million documents of ten random eight-letter words each (deterministic, so about ten
distinct words per document), in JSON Lines files of 250k documents. The same build runs twice
side by side, fresh stores, `backend = "gigatoken"`, formats ["bin"]: as prep runs it (the
engine is loaded afresh once a worker outgrew `prep.stages.tokenize.ENGINE_GROWTH_BYTES`), and
with that bound lifted. Prints wall seconds and the largest process's peak RSS of each, and
whether the two snapshots are the same (they must be: the cache never changes a token).
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from pathlib import Path

from tests.bench.benchsupport import REPO, measure_tree, tokenizer

DOCUMENTS_PER_FILE = 250_000
UNBOUNDED = ("import sys; import prep.stages.tokenize as t; t.ENGINE_GROWTH_BYTES = 1 << 62; "
             "from prep.cli.main import main; sys.argv = ['prep', *sys.argv[1:]]; main()")
"""`prep` with the engine never reloaded: workers are forked from this driver, so they inherit it."""


def open_vocabulary_corpus(workdir: Path, documents: int) -> Path:
    """The corpus (made once): files of documents of ten random eight-letter words."""
    folder = workdir / f"vocab-{documents}"
    if folder.is_dir():
        return folder
    staging = workdir / f"vocab-{documents}.tmp"
    staging.mkdir(parents=True, exist_ok=True)
    rng = random.Random(13)
    for index, start in enumerate(range(0, documents, DOCUMENTS_PER_FILE)):
        with open(staging / f"part-{index:03d}.jsonl", "w", encoding="utf-8") as out:
            for number in range(start, min(documents, start + DOCUMENTS_PER_FILE)):
                words = " ".join("".join(rng.choices(string.ascii_lowercase, k=8)) for _ in range(10))
                out.write(json.dumps({"id": f"v{number}", "text": words}) + "\n")
    staging.rename(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=float, default=1.5, help="millions of documents")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    folder = open_vocabulary_corpus(args.workdir, int(args.documents * 1e6))
    tok = tokenizer(folder, args.workdir / "tokenizer-50257.json")
    spec = args.workdir / "bench-vocab.toml"
    spec.write_text(f'dataset = "vocab"\nseed = 1\n[input]\npaths = ["{folder}"]\nid_field = "id"\n'
                    f'[tokenizer]\npath = "{tok}"\nbackend = "gigatoken"\n'
                    f'[output]\nshard_size = "256MB"\nformats = ["bin"]\n')
    snapshots = []
    for label, entry in (("bounded (as prep runs)", ["-m", "prep.cli.main"]), ("unbounded cache", ["-c", UNBOUNDED])):
        store = args.workdir / "store-vocab"
        if store.exists():
            import shutil

            shutil.rmtree(store)
        run = measure_tree([sys.executable, *entry, "build", str(spec), "--store", str(store),
                            "--workers", str(args.workers)], cwd=REPO)
        snapshots.append(run.stdout.split()[-1])
        print(f"{label:24s} {run.seconds:7.2f} s   largest process {run.max_process_rss / 2**20:7.0f} MB", flush=True)
    print("same snapshot" if snapshots[0] == snapshots[1] else f"DIFFERENT snapshots: {snapshots}")


if __name__ == "__main__":
    main()
