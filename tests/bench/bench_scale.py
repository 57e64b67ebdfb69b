"""Benchmark (not a test): short documents at scale, and appends (issue 13).

    python -m tests.bench.bench_scale [--docs 1,4,16] [--formats "bin;bin,wds"] [--runs 1] [--no-append]
                                      [--no-scale] [--workdir /tmp/prep-bench]

Corpora of 1M, 4M and 16M short documents (40-200 bytes of real text each: fragments of the
`make_corpus.py` texts cut at seeded random places, starting after a space or newline), spread
over JSON Lines files of 1M documents (at least 4 files), made once under the workdir. For each
size: gigatoken's `encode_files` over the same files (the ceiling, only that call timed), then a
complete `prep build` with `backend = "gigatoken"`, --workers = cores, fresh store, formats
["bin"] and ["bin", "wds"]. Prints wall seconds, documents/s, MB/s of text, peak RSS of the
process tree and of the largest single process, the ratio ceiling/build, each stage's seconds
(from the build's progress lines) and, with wds, `dd` writing the same bytes to the same disk (through
the page cache; and direct, then read back direct, as the shard stage does). With `--runs N` the
sizes take turns, one round over all of them at a time, and the end gives each size's median build
seconds (wall, and CPU of every process), median ratio and how much more of each a size took than
the one before it.

The append benchmark builds the 1M corpus, appends 100 new documents to one file and rebuilds
into the same store: rebuild seconds, shards rewritten per format, bytes added to the store, and
what `prep pull NEW DEST` copies when DEST holds the old version.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.bench.bench_fast import CEILING
from tests.bench.benchsupport import (
    REPO,
    TreeRun,
    corpus,
    du_bytes,
    measure,
    measure_tree,
    stage_megabytes,
    stage_seconds,
    tokenizer,
)

DOCS_PER_FILE = 1_000_000
MIN_FILES = 4
SOURCE_MB = 100


def _source_blob(workdir: Path) -> bytes:
    """Every text of the 100 MB real-text corpus, UTF-8, one after another."""
    texts: list[str] = []
    for path in sorted(corpus(workdir, SOURCE_MB).glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            texts.extend(json.loads(line)["text"] for line in handle)
    return "\n".join(texts).encode("utf-8")


def _fragments(blob: bytes, count: int, rng: np.random.Generator) -> list[str]:
    """`count` fragments of 40-200 bytes, each starting after a space or newline of `blob`."""
    starts = rng.integers(0, len(blob) - 400, size=count).tolist()
    sizes = rng.integers(40, 201, size=count).tolist()
    found = []
    for start, size in zip(starts, sizes):
        space = blob.find(b" ", start, start + 200)
        newline = blob.find(b"\n", start, start + 200)
        cut = min((at for at in (space, newline) if at >= 0), default=start - 1) + 1
        found.append(blob[cut:cut + size].decode("utf-8", "ignore"))
    return found


def short_corpus(workdir: Path, documents: int) -> Path:
    """A corpus of `documents` short real-text documents (made once, reused)."""
    out = workdir / f"short-{documents}"
    files = max(MIN_FILES, -(-documents // DOCS_PER_FILE))
    if len(list(out.glob("*.jsonl"))) == files:
        return out
    shutil.rmtree(out, ignore_errors=True)
    staging = workdir / f"short-{documents}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    blob = _source_blob(workdir)
    rng = np.random.default_rng(documents)
    per = -(-documents // files)
    for index in range(files):
        first = index * per
        texts = _fragments(blob, min(per, documents - first), rng)
        with open(staging / f"part-{index:05d}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"id": f"s{first + k:09d}", "text": text}, ensure_ascii=False) + "\n"
                              for k, text in enumerate(texts))
    staging.rename(out)
    return out


def write_pipeline(folder: Path, corpus_dir: Path, tokenizer_path: Path, formats: list[str],
                   shard_size: str = "256MB") -> Path:
    """A fast-backend pipeline over `corpus_dir` writing `formats`."""
    path = folder / f"scale-{'-'.join(formats)}.toml"
    path.write_text(f'dataset = "bench"\nseed = 1\n[input]\npaths = ["{corpus_dir}"]\nid_field = "id"\n'
                    f'[tokenizer]\npath = "{tokenizer_path}"\nbackend = "gigatoken"\n'
                    f'[output]\nshard_size = "{shard_size}"\nformats = {json.dumps(formats)}\n')
    return path


def prep(*args: str) -> list[str]:
    """The command line of a prep command."""
    return [sys.executable, "-m", "prep.cli.main", *args]


def build(spec: Path, store: Path, workers: int) -> TreeRun:
    """A measured `prep build`."""
    return measure_tree(prep("build", str(spec), "--store", str(store), "--workers", str(workers)), cwd=REPO)


def manifest(store: Path) -> dict[str, Any]:
    """The latest snapshot manifest of the benchmark dataset."""
    shown = subprocess.run(prep("show", "bench@latest", "--store", str(store), "--json"), cwd=REPO, check=True,
                           capture_output=True, text=True)
    loaded: dict[str, Any] = json.loads(shown.stdout)
    return loaded


def artifact_bytes(store: Path, formats: tuple[str, ...]) -> int:
    """Bytes of the latest snapshot's artifacts of `formats`."""
    return sum(int(a["size"]) for a in manifest(store)["artifacts"] if a["format"] in formats)


def dd_seconds(folder: Path, nbytes: int) -> tuple[float, float, float]:
    """Seconds `dd` takes, in 8 MiB blocks under `folder`, to write and fsync `nbytes` of zeros
    through the page cache, to write them with O_DIRECT, and to read them back with O_DIRECT
    (what the shard stage does: a direct write, then a direct read of every byte)."""
    target = folder / "dd.tmp"
    count = f"count={max(1, nbytes >> 23)}"
    commands = (["dd", "if=/dev/zero", f"of={target}", "bs=8M", count, "conv=fsync"],
                ["dd", "if=/dev/zero", f"of={target}", "bs=8M", count, "oflag=direct", "conv=fsync"],
                ["dd", f"if={target}", "of=/dev/null", "bs=8M", "iflag=direct"])
    seconds = []
    for command in commands:
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        seconds.append(time.perf_counter() - started)
    target.unlink()
    return seconds[0], seconds[1], seconds[2]


def tokenize_task_seconds(store: Path) -> list[float]:
    """Per-task seconds of the tokenize stage, from the newest build log."""
    logs = sorted((store / "logs" / "bench").glob("*.json"), key=lambda path: path.stat().st_mtime)
    tasks = json.loads(logs[-1].read_text()).get("tasks", {}).get("tokenize", {})
    return sorted(float(log.get("seconds", 0.0)) for log in tasks.values())


@functools.cache
def text_bytes(folder: Path) -> tuple[int, int]:
    """(documents, UTF-8 bytes of text) of a corpus (counted once per run of the benchmark)."""
    documents = total = 0
    for path in sorted(folder.glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                documents += 1
                total += len(json.loads(line)["text"].encode())
    return documents, total


def row(label: str, what: str, seconds: float, documents: int, nbytes: int, run: TreeRun | None, ratio: str) -> None:
    """One printed result line."""
    rss = f"{run.peak_rss / 2**20:8.0f}M {run.max_process_rss / 2**20:8.0f}M" if run else f"{'':9} {'':9}"
    print(f"{label:>5} {what:<22} {seconds:8.2f} {documents / seconds / 1e3:8.1f}k {nbytes / seconds / 1e6:6.2f}"
          f" {rss} {ratio:>6}", flush=True)


def build_once(args: argparse.Namespace, label: str, folder: Path, tok: Path, formats: list[str],
               ceiling_seconds: float) -> tuple[float, float]:
    """One measured `prep build` of `folder` into a fresh store, printed with its details; its wall
    and CPU seconds."""
    documents, nbytes = text_bytes(folder)
    store = args.workdir / "store-scale"
    shutil.rmtree(store, ignore_errors=True)
    load_before = os.getloadavg()[0]
    run = build(write_pipeline(args.workdir, folder, tok, formats), store, args.workers)
    row(label, f"prep build {'+'.join(formats)}", run.seconds, documents, nbytes, run,
        f"{ceiling_seconds / run.seconds:.2f}")
    stages = stage_seconds(run.stderr)
    tasks = tokenize_task_seconds(store)
    print(f"      CPU {run.cpu_seconds:.1f} s (user and system, every process); "
          f"stages: {json.dumps(stages)}; tokenize tasks: {len(tasks)}, "
          f"{sum(tasks):.1f} s in all, longest {max(tasks, default=0):.2f} s; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after", flush=True)
    print(f"      largest process by stage, sampled (MB): {stage_megabytes(run)}", flush=True)
    if "wds" in formats:
        tar = artifact_bytes(store, ("wds",))
        buffered, direct, read = dd_seconds(args.workdir, tar)
        print(f"      dd of the tar bytes ({tar / 1e6:.0f} MB): {buffered:.2f} s through the page cache; "
              f"{direct:.2f} s direct, then {read:.2f} s to read them back direct; "
              f"shard stage {stages.get('shard', 0):.1f} s", flush=True)
    shutil.rmtree(store, ignore_errors=True)
    return run.seconds, run.cpu_seconds


def ceiling_once(label: str, folder: Path, tok: Path) -> float:
    """gigatoken's `encode_files` over `folder`, printed; its seconds."""
    documents, nbytes = text_bytes(folder)
    ceiling = measure([sys.executable, "-c", CEILING, str(folder), str(tok)])
    seconds = float(json.loads(ceiling.stdout)["seconds"])
    print(f"{label:>5} {'gigatoken encode_files':<22} {seconds:8.2f} "
          f"{documents / seconds / 1e3:8.1f}k {nbytes / seconds / 1e6:6.2f} "
          f"{ceiling.peak_rss / 2**20:8.0f}M", flush=True)
    return seconds


def scale(args: argparse.Namespace, tok: Path) -> None:
    """The scale benchmark: `--runs` rounds, each over every corpus size in turn (so a slow spell of
    the machine falls on all sizes alike), then the median of each measurement."""
    print(f"{'docs':>5} {'what':<22} {'seconds':>8} {'docs/s':>9} {'MB/s':>6} {'tree RSS':>9} {'max proc':>9} {'ratio':>6}")
    folders = {millions: short_corpus(args.workdir, int(millions * 1e6)) for millions in args.docs}
    seconds: dict[tuple[float, str], list[float]] = {}  # (size, "ceiling" or formats, or formats + " cpu")
    for _ in range(args.runs):
        for millions, folder in folders.items():
            label = f"{millions:g}M"
            seconds.setdefault((millions, "ceiling"), []).append(ceiling_once(label, folder, tok))
            for formats in args.formats:
                wall, cpu = build_once(args, label, folder, tok, formats, seconds[(millions, "ceiling")][-1])
                seconds.setdefault((millions, "+".join(formats)), []).append(wall)
                seconds.setdefault((millions, "+".join(formats) + " cpu"), []).append(cpu)
    medians(args, seconds)


def medians(args: argparse.Namespace, seconds: dict[tuple[float, str], list[float]]) -> None:
    """Median wall and CPU seconds of each size and build, the median ratio, and the growth of both
    from one size to the next."""
    print(f"medians of {args.runs} run(s):")
    for formats in ["+".join(f) for f in args.formats]:
        previous: tuple[float, float, float] | None = None
        for millions in args.docs:
            wall = float(np.median(seconds[(millions, formats)]))
            cpu = float(np.median(seconds[(millions, formats + " cpu")]))
            ratio = float(np.median(seconds[(millions, "ceiling")])) / wall
            growth = (f"; {wall / previous[1]:.2f}x the wall and {cpu / previous[2]:.2f}x the CPU of the "
                      f"{previous[0]:g}M build for {millions / previous[0]:g}x the documents") if previous else ""
            print(f"  {millions:g}M {formats}: build {wall:.2f} s, CPU {cpu:.1f} s, ratio {ratio:.2f}{growth}",
                  flush=True)
            previous = (millions, wall, cpu)


def append_documents(path: Path, count: int) -> None:
    """Append `count` new short documents to a JSON Lines file."""
    rng = np.random.default_rng(7)
    words = ["append", "document", "shard", "range", "key", "order", "bucket", "token", "fresh", "text"]
    with open(path, "a", encoding="utf-8") as handle:
        for k in range(count):
            text = " ".join(rng.choice(words, size=int(rng.integers(8, 30))).tolist()) + f" #{k}"
            handle.write(json.dumps({"id": f"appended-{k:04d}", "text": text}) + "\n")


def changed_artifacts(old: dict[str, Any], new: dict[str, Any]) -> dict[str, int]:
    """Per format: artifacts of `new` whose (path, sha256) `old` does not have."""
    before = {(a["path"], a["sha256"]) for a in old["artifacts"]}
    changed: dict[str, int] = {}
    for artifact in new["artifacts"]:
        fmt = artifact["format"]
        changed.setdefault(fmt, 0)
        changed[fmt] += (artifact["path"], artifact["sha256"]) not in before
    return changed


def append(args: argparse.Namespace, tok: Path) -> None:
    """Build 1M documents, append 100 to one file, rebuild; what changed, and what pull copies."""
    source = short_corpus(args.workdir, 1_000_000)
    folder = args.workdir / "append-corpus"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    store, dest = args.workdir / "store-append", args.workdir / "pull-append"
    for stale in (store, dest):
        shutil.rmtree(stale, ignore_errors=True)
    spec = write_pipeline(args.workdir, folder, tok, ["bin", "wds"], args.append_shard_size)
    first = build(spec, store, args.workers)
    old = manifest(store)
    subprocess.run(prep("pull", f"sha256:{old['id']}" if "id" in old else "bench@latest", str(dest),
                        "--store", str(store)), cwd=REPO, check=True, capture_output=True)
    before = du_bytes(store)
    append_documents(sorted(folder.glob("*.jsonl"))[len(list(folder.glob("*.jsonl"))) // 2], 100)
    rebuild = build(spec, store, args.workers)
    new = manifest(store)
    added = du_bytes(store) - before
    pulled = measure_tree(prep("pull", "bench@latest", str(dest), "--store", str(store)), cwd=REPO)
    print(f"append: first build {first.seconds:.2f} s; rebuild after 100 appended documents {rebuild.seconds:.2f} s "
          f"(peak {rebuild.peak_rss / 2**20:.0f} MB tree, {rebuild.max_process_rss / 2**20:.0f} MB one process)")
    print(f"        stages: {json.dumps(stage_seconds(rebuild.stderr))}")
    changed = changed_artifacts(old, new)
    files = {fmt: sum(a["format"] == fmt for a in new["artifacts"]) for fmt in changed}
    print(f"        files per format: {json.dumps(files)}; rewritten: {json.dumps(changed)}")
    print(f"        store grew by {added / 1e6:.2f} MB (of {before / 1e6:.0f} MB)")
    print(f"        pull onto the old version ({pulled.seconds:.2f} s): {(pulled.stdout + pulled.stderr).strip()[-600:]}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", default="1,4,16", help="corpus sizes in millions of documents, comma-separated")
    parser.add_argument("--formats", default="bin;bin,wds", help="builds per size: format lists separated by ';'")
    parser.add_argument("--runs", type=int, default=1, help="runs of each scale measurement")
    parser.add_argument("--no-append", action="store_true", help="skip the append benchmark")
    parser.add_argument("--append-shard-size", default="4MB",
                        help="shard_size of the append benchmark (1M short documents are 73 MB of .bin)")
    parser.add_argument("--no-scale", action="store_true", help="skip the scale benchmark")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    args.docs = [float(size) for size in args.docs.split(",")]
    args.formats = [formats.split(",") for formats in args.formats.split(";")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(corpus(args.workdir, SOURCE_MB), args.workdir / "tokenizer-50257.json")
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}", flush=True)
    if not args.no_scale:
        scale(args, tok)
    if not args.no_append:
        append(args, tok)


if __name__ == "__main__":
    main()
