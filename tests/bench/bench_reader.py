"""Benchmark (not a test): prep.data.Reader against a numpy memmap ceiling and megatron-core's
GPTDataset, side by side in one run, on a synthetic pulled snapshot of --tokens token ids.

    python -m tests.bench.bench_reader --tokens 1000000000 --workdir /tmp/prep-bench-reader

1. Start-up: seconds from constructing the reader to its first batch in a folder `prep pull` filled
   (its record says which files it proved, so nothing is hashed again: "pulled"), and in a second
   reader of the same process ("warm"), against megatron-core building GPTDataset's document,
   sample and shuffle indices for the same .bin/.idx (its index cache emptied first). Neither
   side hashes data here; `--cold` also times a reader that hashes every shard first.
2. Throughput: samples/s reading the same windows in the same order through the Reader and
   through plain numpy memmaps with precomputed offsets, one row at a time (the per-row ceiling).
3. Small batches against the gather ceiling: milliseconds a batch of `Reader.batch` at seq 128 x 64
   rows and seq 2048 x 16 rows against one vectorized numpy gather of the same windows from one
   memmap of the same bytes (the shards back to back in one file; `tokens[starts[:, None] +
   arange(seq_len + 1)]`, the starts given, as a loader would build it), int64 out, page cache warm. The
   two alternate round by round (which goes first alternates too), so load on a shared machine
   weighs on both; each round's ratio (ceiling time / reader time) is printed, then the median.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from prep.data.reader import Reader
from prep.data.source import PULLED_MANIFEST, SnapshotSource
from prep.formats import megatron
from prep.hashing import digest_file
from prep.storage import LocalStore
from prep.store import cas
from prep.store.snapshots import publish_manifest
from prep.transfer.pull import pull
from tests.snapshot_factory import manifest_for

SHARD_TOKENS = 128 << 20
SEQ_LEN, GLOBAL_BATCH = 2048, 256
GATHER_SHAPES = ((128, 64), (2048, 16))  # (seq_len, rows) of the small batches timed against the gather


def make_snapshot(dest: Path, tokens: int, seed: int = 0) -> None:
    """A snapshot of random uint16 documents (64..4096 tokens) published in a local store and
    pulled into `dest` with `prep pull` (so the folder holds pull's record), made once."""
    if (dest / PULLED_MANIFEST).exists():
        return
    work = dest.with_name(dest.name + "-work")
    _write_shards(work, tokens, seed)
    store = LocalStore(dest.with_name(dest.name + "-store"))
    artifacts = json.loads((work / "artifacts.json").read_text())
    for artifact in artifacts:
        cas.put_file(store, work / artifact["path"])
    snapshot = publish_manifest(store, manifest_for("bench", artifacts))
    pull(store, snapshot, dest)
    shutil.rmtree(work)


def _write_shards(dest: Path, tokens: int, seed: int) -> None:
    """The shard files and their artifact entries (artifacts.json) under `dest`."""
    rng = np.random.default_rng(seed)
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    artifacts: list[dict[str, Any]] = []
    left, shard = tokens, 0
    while left > 4096:
        lengths = rng.integers(64, 4097, size=SHARD_TOKENS // 2000 + 16, dtype=np.int64)
        ends = np.cumsum(lengths)
        keep = int(np.searchsorted(ends, min(left, SHARD_TOKENS), side="right")) or 1
        lengths = lengths[:keep]
        total = int(lengths.sum())
        prefix = dest / "bin" / f"{shard:016x}"
        with open(megatron.bin_path(prefix), "wb") as out:
            for start in range(0, total, 16 << 20):
                out.write(rng.integers(0, 50000, size=min(16 << 20, total - start), dtype=np.uint16).tobytes())
        megatron.write_index(megatron.idx_path(prefix), lengths, np.uint16)
        for fmt, path in (("bin", megatron.bin_path(prefix)), ("idx", megatron.idx_path(prefix))):
            digest = digest_file(path)
            artifacts.append({"path": f"bin/{path.name}", "format": fmt, "shard": shard, "size": digest.size,
                              "sha256": digest.sha256, "documents": len(lengths), "tokens": total})
        left, shard = left - total, shard + 1
    (dest / "artifacts.json").write_text(json.dumps(artifacts))


def reader_start(dest: Path) -> tuple[float, Reader]:
    started = time.perf_counter()
    reader = Reader(dest, seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH)
    reader.batch(0)
    return time.perf_counter() - started, reader


def megatron_start(dest: Path) -> float:
    """Seconds for megatron-core to build GPTDataset's indices over every shard, one epoch each
    (its index cache emptied first), and read one sample."""
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    cache = Path(tempfile.mkdtemp(prefix="megatron-cache-"))
    try:
        started = time.perf_counter()
        for prefix in sorted({p.with_suffix("") for p in (dest / "bin").glob("*.bin")}):
            indexed = IndexedDataset(str(prefix), mmap=True)
            config = GPTDatasetConfig(random_seed=0, sequence_length=SEQ_LEN, path_to_cache=str(cache),
                                      tokenizer=NullTokenizer(50000), reset_position_ids=False, reset_attention_mask=False,
                                      eod_mask_loss=False, split="1,0,0", mid_level_dataset_surplus=0.005)
            samples = (int(indexed.sequence_lengths.sum()) - 1) // SEQ_LEN
            if not samples:
                continue
            dataset = GPTDataset(indexed, str(prefix), np.arange(len(indexed.sequence_lengths)), samples, Split.train,
                                 config)
            dataset[0]
        return time.perf_counter() - started
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def throughput(reader: Reader, steps: int) -> tuple[float, float]:
    """(reader samples/s, memmap ceiling samples/s) over the same windows in the same order."""
    source = reader.sources[0]
    maps = [np.memmap(shard.bin_path, dtype=np.uint16, mode="r") for shard in source.shards]
    picks = [[i for _, _, i in reader.sample_ids(step * GLOBAL_BATCH, GLOBAL_BATCH)] for step in range(steps)]
    located = []
    for ids in picks:
        starts = np.asarray(ids, dtype=np.int64) * SEQ_LEN
        shard = np.searchsorted(source.token_starts, starts, side="right") - 1
        located.append((shard, starts - source.token_starts[shard]))
    started = time.perf_counter()
    for step in range(steps):
        reader.batch(step)
    ours = steps * GLOBAL_BATCH / (time.perf_counter() - started)
    started = time.perf_counter()
    for shards, offsets in located:
        rows = []
        for shard, offset in zip(shards.tolist(), offsets.tolist()):
            end = offset + SEQ_LEN + 1
            rows.append(maps[shard][offset:end] if end <= len(maps[shard]) else
                        np.concatenate([maps[shard][offset:], maps[shard + 1][:end - len(maps[shard])]]))
        np.stack(rows).astype(np.int64)
    ceiling = steps * GLOBAL_BATCH / (time.perf_counter() - started)
    return ours, ceiling


def stream_file(dest: Path) -> Path:
    """The snapshot's shards back to back in one file (the gather ceiling maps it), made once."""
    path = dest.with_name(dest.name + "-stream.bin")
    if not path.exists():
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as out:
            for shard in SnapshotSource.open(dest).shards:
                with open(shard.bin_path, "rb") as part:
                    shutil.copyfileobj(part, out, 16 << 20)
        partial.rename(path)
    return path


def gather_rounds(dest: Path, seq_len: int, rows: int, steps: int, rounds: int) -> list[tuple[float, float]]:
    """(reader, gather ceiling) seconds a batch in each round: `Reader.batch` of steps 0.. against one
    vectorized gather of the same windows (their starts given) from a memmap of the stream, int64
    out, alternating."""
    reader = Reader(dest, seq_len=seq_len, global_batch_size=rows)
    tokens = np.memmap(stream_file(dest), dtype=reader.sources[0].dtype, mode="r")
    columns = np.arange(seq_len + 1, dtype=np.int64)
    starts = [np.asarray([i for _, _, i in reader.sample_ids(step * rows, rows)], dtype=np.int64)[:, None] * seq_len
              for step in range(steps)]
    assert (reader.batch(0) == tokens[starts[0] + columns].astype(np.int64)).all(), "the two read other windows"

    def ours() -> float:
        started = time.perf_counter()
        for step in range(steps):
            reader.batch(step)
        return (time.perf_counter() - started) / steps

    def ceiling() -> float:
        started = time.perf_counter()
        for first in starts:
            tokens[first + columns].astype(np.int64)
        return (time.perf_counter() - started) / steps

    ours(), ceiling()  # warm: page cache, first-call costs
    timed = []
    for round_ in range(rounds):
        if round_ % 2:
            gather = ceiling()
            timed.append((ours(), gather))
        else:
            timed.append((ours(), ceiling()))
    reader.close()
    return timed


def report_gather(dest: Path, steps: int, rounds: int) -> None:
    """Print each shape's rounds and median ratio (gather ceiling time / reader time)."""
    for seq_len, rows in GATHER_SHAPES:
        timed = gather_rounds(dest, seq_len, rows, steps, rounds)
        ratios = sorted(gather / ours for ours, gather in timed)
        shown = ", ".join(f"{gather / ours:.2f}" for ours, gather in timed)
        print(f"seq {seq_len} x {rows} rows: reader {np.median([t[0] for t in timed]) * 1e3:.3f} ms a batch, "
              f"gather ceiling {np.median([t[1] for t in timed]) * 1e3:.3f} ms; ratio per round {shown}; "
              f"median {np.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10**9)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench-reader"))
    parser.add_argument("--cold", action="store_true", help="also time a reader that hashes every shard")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds against the gather ceiling")
    parser.add_argument("--gather-steps", type=int, default=1000, help="batches a round, against the gather ceiling")
    parser.add_argument("--gather-only", action="store_true", help="only the small batches against the gather ceiling")
    args = parser.parse_args()
    dest = args.workdir / f"snapshot-{args.tokens}"
    make_snapshot(dest, args.tokens)
    if args.gather_only:
        report_gather(dest, args.gather_steps, args.rounds)
        return
    cold, reader = reader_start(dest)
    warm, _ = reader_start(dest)
    hashed = None
    if args.cold:
        from prep.data import source

        source._CHECKED.clear()
        (dest / ".prep" / "verified.jsonl").rename(dest / ".prep" / "verified.jsonl.off")
        try:
            hashed = reader_start(dest)[0]
        finally:
            (dest / ".prep" / "verified.jsonl.off").rename(dest / ".prep" / "verified.jsonl")
    theirs = megatron_start(dest) if importlib.util.find_spec("megatron") is not None else None
    ours, ceiling = throughput(reader, args.steps)
    print(f"tokens {reader.sources[0].total_tokens}, shards {len(reader.sources[0].shards)}, samples {reader.sizes[0]}")
    print(f"start-up  prep pulled {cold:.3f} s, prep warm {warm:.3f} s, "
          + (f"megatron GPTDataset indices {theirs:.2f} s: megatron/prep-pulled {theirs / cold:.0f}x" if theirs is not None
             else "megatron-core not installed (no GPTDataset comparison)")
          + (f"; prep hashing every shard first {hashed:.2f} s" if hashed is not None else ""))
    print(f"throughput prep {ours:.0f} samples/s, memmap ceiling {ceiling:.0f} samples/s, ratio {ours / ceiling:.2f}")
    report_gather(dest, args.gather_steps, args.rounds)


if __name__ == "__main__":
    main()
