"""Benchmark (not a test): what carrying `[input] metadata_fields` costs a build, side by side in
one run: the real-text corpus of ../shared/bench/make_corpus.py with three metadata fields added to
every record (a URL, a license string and a small nested object), as whole documents and cut into
paragraphs (many short documents), built from the same files with
and without `metadata_fields = ["url", "license", "crawl"]`, rounds alternated, each in an empty
store, the median of --runs rounds. Prints wall seconds, CPU seconds of the whole process tree
(what the work cost, less moved by a shared machine), input MB/s and the ratios.

    python -m tests.bench.bench_metadata --sizes 100 --runs 3 --workers 2

The plain build reads each JSON Lines block through Arrow's parser; a build with metadata fields
reads line by line (docs/build.md, "Metadata"), carries each document's metadata through the
intermediate and entries objects, and writes it into the `.json` members and the `.bin`'s metadata
file: this benchmark is that difference.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

from tests.bench.benchsupport import Setup, corpus_bytes, measure_tree, setup

FIELDS = ["url", "license", "crawl"]


def with_fields(source: Path, out: Path, paragraphs: bool) -> Path:
    """`source`'s records (or, with `paragraphs`, each paragraph of 40 characters or more as a
    record: many short documents, where a per-document cost weighs), each with the metadata fields
    added (made once, reused)."""
    if any(out.glob("*.jsonl")):
        return out
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.glob("*.jsonl")):
        with open(path, encoding="utf-8") as reader, open(out / path.name, "w", encoding="utf-8") as writer:
            number = 0
            for line in reader:
                record = json.loads(line)
                texts = [part for part in record["text"].split("\n\n") if len(part.strip()) >= 40] if paragraphs \
                    else [record["text"]]
                for text in texts:
                    writer.write(json.dumps({"id": f"{path.stem}/{number}", "text": text, **_fields(path, number)},
                                            ensure_ascii=False) + "\n")
                    number += 1
    return out


def _fields(path: Path, number: int) -> dict[str, object]:
    return {"url": f"https://example.org/{path.stem}/{number}", "license": ["MIT", "CC-BY-4.0"][number % 2],
            "crawl": {"name": f"crawl-{number % 7}", "score": round(number % 97 / 97, 3)}}


def pipeline(folder: Path, corpus_dir: Path, bench: Setup, metadata: bool) -> Path:
    path = folder / f"bench-metadata-{'on' if metadata else 'off'}.toml"
    fields = f"metadata_fields = {json.dumps(FIELDS)}\n" if metadata else ""
    path.write_text(f'dataset = "bench"\nseed = 1\n[input]\npaths = ["{corpus_dir}"]\nid_field = "id"\n{fields}'
                    f'[tokenizer]\npath = "{bench.tokenizer}"\nbackend = "gigatoken"\n'
                    f'[output]\nshard_size = "256MB"\nformats = ["bin", "wds"]\n')
    return path


def main() -> None:
    bench = setup(__doc__, "100")
    for source, shape in [(source, shape) for source in bench.corpora for shape in ("documents", "paragraphs")]:
        corpus_dir = with_fields(source, bench.workdir / f"{source.name}-metadata-{shape}", shape == "paragraphs")
        megabytes = corpus_bytes(corpus_dir) / 1e6
        documents = sum(1 for path in corpus_dir.glob("*.jsonl") for _ in path.open(encoding="utf-8"))
        seconds: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(bench.runs):
            for metadata in (False, True):
                store = bench.workdir / "store-metadata"
                shutil.rmtree(store, ignore_errors=True)
                run = measure_tree([sys.executable, "-m", "prep.cli.main", "build",
                                    str(pipeline(bench.workdir, corpus_dir, bench, metadata)), "--store", str(store),
                                    "--workers", str(bench.workers)])
                seconds[metadata].append(run.seconds)
                cpu[metadata].append(run.cpu_seconds)
        print(f"{source.name} as {shape}: {documents:,} documents, {megabytes:.0f} MB of text, {bench.workers} workers, "
              f"medians of {bench.runs}")
        for metadata in (False, True):
            wall, work = statistics.median(seconds[metadata]), statistics.median(cpu[metadata])
            print(f"  metadata {'on ' if metadata else 'off'}: {wall:6.1f} s wall ({megabytes / wall:5.1f} MB/s), "
                  f"{work:6.1f} s CPU")
        print(f"  ratio on/off: wall {statistics.median(seconds[True]) / statistics.median(seconds[False]):.2f}, "
              f"CPU {statistics.median(cpu[True]) / statistics.median(cpu[False]):.2f}")


if __name__ == "__main__":
    main()
