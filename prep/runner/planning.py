"""Planning helpers of the build driver: hashing inputs (in the driver's threads or on the
workers), splitting work into balanced contiguous jobs, and the no-change hint that decides
whether workers warm up."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prep.config import Pipeline
from prep.errors import PrepError
from prep.inputs.exclusions import Exclusions, load_exclusions
from prep.inputs.sources import SourceFile, hash_source
from prep.runner.executors.base import Executor
from prep.runner.tasks import HashJob, run_hash_job
from prep.stages.specs import TokenizeSettings
from prep.storage.backend import Store
from prep.store.refs import read_ref
from prep.store.snapshots import Snapshot, load_snapshot

HASH_BATCH_BYTES = 256 << 20
HASH_BATCH_FILES = 512


def unchanged_latest(store: Store, pipeline: Pipeline, sources: list[SourceFile], code: dict[str, Any],
                     tokenizer_sha256: str) -> Snapshot | None:
    """The dataset's latest snapshot when it has this config, seed, code, tokenizer and the same
    input paths and sizes: then tokenization will likely be all cache hits (workers need not load the
    tokenizer up front) and its artifacts reused. Only a scheduling hint: cache hits are decided
    by content keys."""
    try:
        ref = read_ref(store, pipeline.dataset, "latest")
        snapshot = load_snapshot(store, ref.snapshot) if ref is not None else None
    except PrepError:
        return None
    if snapshot is None:
        return None
    manifest = snapshot.manifest
    recorded = [(entry.get("path"), entry.get("size")) for entry in manifest.get("inputs", {}).get("files", [])]
    same = (manifest.get("config") == pipeline.resolved() and manifest.get("seed") == pipeline.seed
            and manifest.get("code") == code
            and manifest.get("tokenizer", {}).get("sha256") == tokenizer_sha256
            and recorded == [(source.rel, source.size) for source in sources])
    return snapshot if same else None


def hash_inputs(sources: list[SourceFile], executor: Executor) -> list[SourceFile]:
    """Hash every input; returns the sources in their original order. Where the workers share
    this machine, the driver hashes in its own threads while the workers are still starting
    (the same cores; a hash job would wait for a worker's imports and tokenizer), and spools S3
    inputs here, where the tasks read them. Elsewhere the workers hash, in batches of files."""
    if executor.shares_filesystem:
        threads = max(1, min(2 * executor.workers, len(sources)))
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda source: hash_source(source, True), sources))
    batches: list[list[SourceFile]] = [[]]
    size = 0
    for source in sources:
        if batches[-1] and (size >= HASH_BATCH_BYTES or len(batches[-1]) >= HASH_BATCH_FILES):
            batches.append([])
            size = 0
        batches[-1].append(source)
        size += source.size
    jobs = [HashJob(tuple(batch), spool=False) for batch in batches]
    hashed: dict[int, list[SourceFile]] = dict(executor.run(run_hash_job, jobs))
    return [source for index in range(len(batches)) for source in hashed[index]]


def hash_inputs_meanwhile(sources: list[SourceFile], executor: Executor,
                          meanwhile: Callable[[], object] | None) -> list[SourceFile]:
    """`hash_inputs`, with `meanwhile` running on a thread of its own until both are done."""
    if meanwhile is None:
        return hash_inputs(sources, executor)
    with ThreadPoolExecutor(max_workers=1) as side:
        pending = side.submit(meanwhile)
        hashed = hash_inputs(sources, executor)
        pending.result()
    return hashed


def contiguous_ranges(weights: list[int], count: int) -> list[tuple[int, int]]:
    """Split a list into min(count, len) contiguous, non-empty [start, end) ranges of similar
    total weight, covering every index once (a range ends where the running total reaches the
    next 1/count of the whole, or where the items left are just enough for the ranges left)."""
    total = max(1, sum(weights))
    ranges: list[tuple[int, int]] = []
    start, acc = 0, 0
    for index, size in enumerate(weights):
        acc += size
        items_left = len(weights) - index - 1
        ranges_left = count - len(ranges) - 1
        if items_left and ranges_left and (acc >= total * (len(ranges) + 1) / count or items_left <= ranges_left):
            ranges.append((start, index + 1))
            start = index + 1
    if start < len(weights):
        ranges.append((start, len(weights)))
    return ranges


def describe_inputs(sources: list[SourceFile], most: int = 5) -> str:
    """The input files by location for a message: all of them when few, else the first few."""
    names = [source.location for source in sources[:most]]
    more = f" and {len(sources) - most} more" if len(sources) > most else ""
    return ", ".join(names) + more


def tokenize_settings(pipeline: Pipeline, tokenizer_path: str, tokenizer_sha256: str,
                      exclusions: Exclusions | None = None) -> TokenizeSettings:
    """The tokenize tasks' settings for `pipeline`: its tokenizer file, pinned by hash, its
    seed, whose key order the intermediates are laid out in, and its exclusion table's object id."""
    return TokenizeSettings(tokenizer_path, tokenizer_sha256, pipeline.tokenizer.eos,
                            pipeline.tokenizer.encode_special_tokens, pipeline.tokenizer.backend,
                            pipeline.input.on_error, order_seed=pipeline.seed,
                            tokenizer_cache=pipeline.build.tokenizer_cache, steps=pipeline.steps,
                            metadata_keys=pipeline.metadata_keys(), near=pipeline.dedup.near,
                            exclude=f"sha256:{exclusions.sha256}" if exclusions is not None else None)


def read_exclusions(pipeline: Pipeline) -> Exclusions | None:
    """The pipeline's deletion requests (`[input] exclude`), read and checked before any task runs:
    InputError naming FILE:LINE for a bad line, FILE for a list that cannot be read."""
    return load_exclusions(pipeline.input.exclude, pipeline.base_dir, pipeline.input.id_field is not None)
