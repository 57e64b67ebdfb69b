"""Benchmark (not a test): a worker's memory on a corpus whose vocabulary never stops growing.

    python -m tests.bench.bench_vocab [--documents 2] [--rounds 20] [--workdir /tmp/prep-bench] [--workers 2]

gigatoken caches every distinct pre-token it has encoded, without a bound; a tokenize worker
loads its engine afresh once it grew `[build] tokenizer_cache` past its size at load. Side by
side in one run:
- gigatoken alone, in this process: resident MB after each round of 100k documents of ten random
  eight-letter words (a million new words a round);
- `prep build` (fresh store, `backend = "gigatoken"`, formats ["bin"]) of DOCUMENTS million such
  documents with the default bound, with a tight one (TIGHT), with the bound lifted (1 TiB), and
  the same number of short real-text documents (`bench_scale`'s corpus) with the default and
  the tight bound: wall seconds, the largest process's peak RSS, and whether all builds of a
  corpus give the same snapshot (they must: a cache never changes a token).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import string
import sys
from pathlib import Path

from tests.bench.bench_scale import short_corpus
from tests.bench.benchsupport import REPO, measure_tree, tokenizer

DOCUMENTS_PER_FILE = 250_000
TIGHT = "32MiB"


def _words(rng: random.Random, count: int) -> list[str]:
    """`count` documents of ten random eight-letter words each."""
    return [" ".join("".join(rng.choices(string.ascii_lowercase, k=8)) for _ in range(10)) for _ in range(count)]


def open_vocabulary_corpus(workdir: Path, documents: int) -> Path:
    """The corpus (made once): JSON Lines files of 250k documents of random words."""
    folder = workdir / f"vocab-{documents}"
    if folder.is_dir():
        return folder
    staging = workdir / f"vocab-{documents}.tmp"
    staging.mkdir(parents=True, exist_ok=True)
    rng = random.Random(13)
    for index, start in enumerate(range(0, documents, DOCUMENTS_PER_FILE)):
        count = min(documents, start + DOCUMENTS_PER_FILE) - start
        with open(staging / f"part-{index:03d}.jsonl", "w", encoding="utf-8") as out:
            out.writelines(json.dumps({"id": f"v{start + i}", "text": text}) + "\n"
                           for i, text in enumerate(_words(rng, count)))
    staging.rename(folder)
    return folder


def gigatoken_alone(tokenizer_path: Path, rounds: int) -> list[int]:
    """Resident MB after each round of 100k new-word documents encoded by one gigatoken Tokenizer."""
    import gigatoken

    from prep.memory import resident_bytes

    tok = gigatoken.Tokenizer(str(tokenizer_path))
    rng = random.Random(2)
    sizes = []
    for _ in range(rounds):
        tok.encode_batch(_words(rng, 100_000))
        sizes.append((resident_bytes() or 0) >> 20)
    return sizes


def build(spec: Path, store: Path, workers: int) -> tuple[float, int, str]:
    """Seconds, the largest process's peak RSS in MB, and the snapshot id of a fresh build."""
    if store.exists():
        shutil.rmtree(store)
    run = measure_tree([sys.executable, "-m", "prep.cli.main", "build", str(spec), "--store", str(store),
                        "--workers", str(workers)], cwd=REPO)
    return run.seconds, run.max_process_rss >> 20, run.stdout.split()[-1]


def _spec(path: Path, folder: Path, tok: Path, cache: str | None) -> Path:
    path.write_text(f'dataset = "vocab"\nseed = 1\n[input]\npaths = ["{folder}"]\nid_field = "id"\n'
                    f'[tokenizer]\npath = "{tok}"\nbackend = "gigatoken"\n[output]\nshard_size = "256MB"\nformats = ["bin"]\n'
                    + (f'[build]\ntokenizer_cache = "{cache}"\n' if cache else ""))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=float, default=2, help="millions of documents")
    parser.add_argument("--rounds", type=int, default=20, help="rounds of gigatoken alone")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    documents = int(args.documents * 1e6)
    open_vocab, real = open_vocabulary_corpus(args.workdir, documents), short_corpus(args.workdir, documents)
    tok = tokenizer(real, args.workdir / "tokenizer-50257.json")
    print(f"gigatoken alone, resident MB after each million new words: {gigatoken_alone(tok, args.rounds)}", flush=True)
    store = args.workdir / "store-vocab"
    runs = [("open vocabulary", open_vocab, None), ("open vocabulary", open_vocab, TIGHT),
            ("open vocabulary", open_vocab, "1TiB"), ("real text", real, None), ("real text", real, TIGHT)]
    snapshots: dict[str, set[str]] = {}
    for label, folder, cache in runs:
        spec = _spec(args.workdir / "bench-vocab.toml", folder, tok, cache)
        seconds, largest, snapshot = build(spec, store, args.workers)
        snapshots.setdefault(label, set()).add(snapshot)
        print(f"prep build, {args.documents:g}M documents, {label}, tokenizer_cache {cache or 'default':8s} "
              f"{seconds:7.2f} s   largest process {largest:6d} MB", flush=True)
    for label, ids in snapshots.items():
        print(f"{label}: {'one snapshot for every bound' if len(ids) == 1 else f'DIFFERENT snapshots {sorted(ids)}'}")


if __name__ == "__main__":
    main()
