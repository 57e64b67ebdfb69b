"""`prep build`: plan every stage, skip what is committed, run the rest, publish the snapshot.

Stages: tokenize (read + hash + tokenize, one task per file part) -> dedup (global decisions over
text hashes) -> shuffle (plan of every output byte) -> shard (assemble groups of shards) ->
publish (snapshot manifest, then refs by compare-and-swap).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prep import cas
from prep.code import code_identity
from prep.config import Pipeline
from prep.errors import InputError, PrepError, StoreError
from prep.faults import crash_point
from prep.gc import Lease, build_lease
from prep.refs import Ref, move_ref, read_ref
from prep.runner import records
from prep.runner.executor import Executor, WarmUp
from prep.runner.progress import Progress
from prep.runner.tasks import (
    AssembleJob,
    DedupJob,
    HashJob,
    PartRef,
    ShuffleJob,
    TaskResult,
    TokenizeJob,
    publish_staged,
    run_assemble_job,
    run_dedup_job,
    run_hash_job,
    run_shuffle_job,
    run_tokenize_job,
)
from prep.snapshots import Snapshot, load_snapshot, publish_manifest
from prep.sources import SourceFile, discover, input_version, release_spool
from prep.stages.read import ReadTask, plan_read_tasks
from prep.stages.specs import UNIT_FILES, UNITS, ShardSpec, TokenizeSettings
from prep.storage.base import Store
from prep.tokenizer import describe_tokenizer

LOGS_PREFIX = "logs/"
HASH_BATCH_BYTES = 256 << 20
HASH_BATCH_FILES = 512
ARTIFACT_FILES = {"bin": ("bin", "bin"), "idx": ("bin", "idx"), "wds": ("wds", "tar")}


@dataclass
class StageRun:
    """What one stage did in this build: tasks run and tasks served from commit records."""

    name: str
    key: str = ""
    ran: int = 0
    cached: int = 0
    output: str = ""


@dataclass
class BuildResult:
    snapshot: Snapshot
    refs: list[Ref]
    stages: dict[str, StageRun] = field(default_factory=dict)
    log_key: str = ""


class _Builder:
    def __init__(self, pipeline: Pipeline, store: Store, executor: Executor, progress: Progress) -> None:
        self.pipeline, self.store, self.executor, self.progress = pipeline, store, executor, progress
        self.code = code_identity()
        self.stages: dict[str, StageRun] = {}
        self.log: dict[str, Any] = {"tasks": {}}

    # -- generic task running ---------------------------------------------------------------
    def run_tasks(self, stage: str, jobs: Sequence[tuple[str, Any]], fn: Callable[[Any], TaskResult],
                  nbytes: Callable[[Any], int] = lambda job: 0) -> dict[str, dict[str, Any]]:
        """Run every job whose task record is missing; return every task's record by key."""
        run = self.stages.setdefault(stage, StageRun(stage))
        committed: dict[str, dict[str, Any]] = {}
        todo: list[tuple[str, Any]] = []
        for key, job in jobs:
            record = records.read_task_record(self.store, stage, key)
            if record is None:
                todo.append((key, job))
            else:
                committed[key] = record
        run.cached += len(committed)
        todo.sort(key=lambda item: -nbytes(item[1]))  # largest first: less idle time at the end
        done_bytes = 0
        self.progress.tick(stage, len(committed), len(jobs), len(committed), force=True)
        for index, result in self.executor.run(fn, [job for _, job in todo]):
            key, job = todo[index]
            result = publish_staged(self.store, result)
            crash_point(f"{stage}.before_commit")
            committed[key] = records.write_task_record(self.store, stage, key, result.outputs, result.summary)
            if result.log:
                self.log["tasks"].setdefault(stage, {})[key] = result.log
            run.ran += 1
            done_bytes += nbytes(job)
            self.progress.tick(stage, len(committed), len(jobs), run.cached, done_bytes)
        return committed

    def stage_key(self, stage: str, settings: dict[str, Any], inputs: Any) -> str:
        key = records.content_key(stage, settings, self.code, inputs)
        self.stages.setdefault(stage, StageRun(stage)).key = key
        return key

    def commit_stage(self, stage: str, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
        existing = records.read_stage(self.store, stage, key)
        if existing is None:
            records.commit_stage(self.store, stage, key, manifest)
            existing = records.read_stage(self.store, stage, key)
        assert existing is not None
        self.stages[stage].output = records.stage_output_id(self.store, stage, key)
        return existing

    # -- stages -----------------------------------------------------------------------------
    def tokenize(self, sources: list[SourceFile], settings: TokenizeSettings) -> list[dict[str, Any]]:
        tasks: list[ReadTask] = []
        for source in sources:
            tasks.extend(plan_read_tasks(source, self.pipeline.input.text_field, self.pipeline.input.id_field))
        # Where workers share this machine's store, the driver stores intermediates (and waits
        # for their fsync) while the workers go on tokenizing.
        driver_stores = self.executor.shares_filesystem and self.store.local_path("objects") is not None
        jobs = []
        for task in tasks:
            key = records.content_key("tokenize", settings.key_fields(), self.code, task.describe(),
                                      task.text_field, task.id_field)
            jobs.append((key, TokenizeJob(self.store.url, task, settings, driver_stores)))
        total_bytes = sum(source.size for source in sources)
        self.progress.stage("tokenize", f"{len(jobs)} tasks over {len(sources)} files, {total_bytes / 1e6:.1f} MB")
        done = self.run_tasks("tokenize", jobs, run_tokenize_job, _task_bytes)
        entries: list[dict[str, Any]] = []
        line_offsets: dict[str, int] = {}
        for (key, job) in jobs:
            record = done[key]
            summary = record["summary"]
            offset = line_offsets.get(job.task.source.rel, 0)
            line_offsets[job.task.source.rel] = offset + int(summary.get("lines", 0))
            entries.append({**job.task.describe(), "key": key, "output": record["outputs"]["intermediate"],
                            "line_offset": offset, **{k: v for k, v in summary.items()}})
        stage_key = self.stage_key("tokenize", settings.key_fields(), [key for key, _ in jobs])
        manifest = self.commit_stage("tokenize", stage_key, {"tasks": entries})
        self.progress.done("tokenize", f"{self.stages['tokenize'].ran} run, {self.stages['tokenize'].cached} cached")
        return list(manifest["tasks"])

    def parts(self, entries: list[dict[str, Any]]) -> tuple[PartRef, ...]:
        return tuple(PartRef(e["output"], e["source"], e["format"], e["line_offset"], e["documents"]) for e in entries)

    def single(self, stage: str, settings: dict[str, Any], inputs: Any, job: Any,
               fn: Callable[[Any], TaskResult]) -> dict[str, Any]:
        """A stage of one task: its task key is its stage key."""
        key = self.stage_key(stage, settings, inputs)
        existing = records.read_stage(self.store, stage, key)
        if existing is not None:
            self.stages[stage].cached += 1
            self.stages[stage].output = records.stage_output_id(self.store, stage, key)
            return existing
        self.progress.stage(stage)
        record = self.run_tasks(stage, [(key, job)], fn)[key]
        manifest = self.commit_stage(stage, key, {"outputs": record["outputs"], **record["summary"]})
        counts = [f"{k}={v}" for k, v in record["summary"].items() if isinstance(v, int)]
        self.progress.done(stage, ", ".join(counts) or f"{len(record['outputs'])} outputs")
        return manifest

    def shard(self, parts: tuple[PartRef, ...], keep_id: str, shuffle: dict[str, Any], dtype: str,
              eos_id: int, workers: int) -> list[dict[str, Any]]:
        """Write every shard's units (bin: .bin and .idx; wds: .tar), each with its own task
        record; jobs get contiguous runs of units of similar size, at most one per worker."""
        formats = self.pipeline.output.formats
        settings = {"formats": list(formats), "dtype": dtype, "eos_id": eos_id}
        stage_key = self.stage_key("shard", settings, [self.stages["shuffle"].output])
        specs = [ShardSpec.from_json(s) for s in shuffle["shards"]]
        units = [(spec, unit) for spec in specs for unit in _units(formats)]
        unit_keys = {(spec.index, unit): records.content_key(stage_key, spec.index, unit) for spec, unit in units}
        missing = [(spec, unit) for spec, unit in units
                   if records.read_task_record(self.store, "shard", unit_keys[spec.index, unit]) is None]
        self.progress.stage("shard", f"{len(specs)} shards, {len(units) - len(missing)} of {len(units)} files committed")
        weights = [spec.bin_size if unit == "bin" else spec.tar_size for spec, unit in missing]
        groups = [tuple(missing[start:end]) for start, end in _contiguous_ranges(weights, workers)]
        jobs = [AssembleJob(self.store.url, parts, keep_id, shuffle["outputs"]["plan"], group, dtype, eos_id)
                for group in groups]
        run = self.stages["shard"]
        for index, result in self.executor.run(run_assemble_job, jobs):
            for spec, unit in groups[index]:
                files = UNIT_FILES[unit]
                crash_point("shard.before_commit")
                records.write_task_record(self.store, "shard", unit_keys[spec.index, unit],
                                          {fmt: result.outputs[f"{spec.index}/{fmt}"] for fmt in files},
                                          {"sizes": {fmt: result.summary["sizes"][f"{spec.index}/{fmt}"] for fmt in files}})
                run.ran += 1
        run.cached = len(units) - len(missing)
        shards = []
        for spec in specs:
            outputs: dict[str, str] = {}
            sizes: dict[str, int] = {}
            for unit in _units(formats):
                record = records.read_task_record(self.store, "shard", unit_keys[spec.index, unit])
                assert record is not None
                outputs.update(record["outputs"])
                sizes.update(record["summary"]["sizes"])
            shards.append({**spec.to_json(), "outputs": outputs, "sizes": sizes})
        self.commit_stage("shard", stage_key, {"shards": shards})
        self.progress.done("shard", f"{run.ran} files written, {run.cached} cached")
        return shards


def _looks_unchanged(store: Store, pipeline: Pipeline, sources: list[SourceFile], code: dict[str, Any],
                     tokenizer_sha256: str) -> bool:
    """True when the dataset's latest snapshot has this config, code, tokenizer and the same input
    paths and sizes: then tokenization will likely be all cache hits and workers need not load
    the tokenizer up front. Only a scheduling hint: cache hits are decided by content keys."""
    try:
        ref = read_ref(store, pipeline.dataset, "latest")
        manifest = load_snapshot(store, ref.snapshot).manifest if ref is not None else None
    except PrepError:
        return False
    if manifest is None:
        return False
    recorded = [(entry.get("path"), entry.get("size")) for entry in manifest.get("inputs", {}).get("files", [])]
    return (manifest.get("config") == pipeline.resolved() and manifest.get("code") == code
            and manifest.get("tokenizer", {}).get("sha256") == tokenizer_sha256
            and recorded == [(source.rel, source.size) for source in sources])


def _hash_inputs(sources: list[SourceFile], executor: Executor) -> list[SourceFile]:
    """Hash every input on the executor's workers, in batches of files (the driver reads no
    input bytes itself); returns the sources in their original order."""
    batches: list[list[SourceFile]] = [[]]
    size = 0
    for source in sources:
        if batches[-1] and (size >= HASH_BATCH_BYTES or len(batches[-1]) >= HASH_BATCH_FILES):
            batches.append([])
            size = 0
        batches[-1].append(source)
        size += source.size
    jobs = [HashJob(tuple(batch), spool=executor.shares_filesystem) for batch in batches]
    hashed: dict[int, list[SourceFile]] = dict(executor.run(run_hash_job, jobs))
    return [source for index in range(len(batches)) for source in hashed[index]]


def _contiguous_ranges(weights: list[int], count: int) -> list[tuple[int, int]]:
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


def _task_bytes(job: TokenizeJob) -> int:
    """Input bytes a tokenize task covers, for rates (a Parquet file counts once, at part 0,
    since its task ranges count row groups, not bytes)."""
    task = job.task
    if task.source.format == "parquet":
        return task.source.size if task.part == 0 else 0
    return task.end - task.start


def _units(formats: tuple[str, ...]) -> list[str]:
    """The shard units the output formats ask for (each format is one unit)."""
    return [unit for unit in UNITS if unit in formats]


def _artifact_formats(formats: tuple[str, ...]) -> list[str]:
    """Every artifact file format of a shard: bin, idx, wds."""
    return [fmt for unit in _units(formats) for fmt in UNIT_FILES[unit]]


def _artifacts(shards: list[dict[str, Any]], formats: tuple[str, ...]) -> list[dict[str, Any]]:
    artifacts = []
    for shard in shards:
        for fmt in _artifact_formats(formats):
            folder, extension = ARTIFACT_FILES[fmt]
            artifacts.append({
                "path": f"{folder}/{shard['index']:05d}.{extension}", "format": fmt, "shard": shard["index"],
                "size": shard["sizes"][fmt], "sha256": cas.parse_id(shard["outputs"][fmt]),
                "documents": shard["documents"], "tokens": shard["tokens"],
            })
    return sorted(artifacts, key=lambda a: a["path"])


def build(pipeline: Pipeline, store: Store, executor: Executor, tags: Sequence[str] = (),
          progress: Progress | None = None) -> BuildResult:
    """Run the pipeline into `store` and publish it; returns the snapshot and moved refs.

    The whole build holds a build lease, so garbage collection never runs while this build may
    still commit what it found in the store (docs/history.md)."""
    with build_lease(store) as lease:
        return _build(pipeline, store, executor, tags, progress or Progress(), lease)


def _build(pipeline: Pipeline, store: Store, executor: Executor, tags: Sequence[str], progress: Progress,
           lease: Lease) -> BuildResult:
    builder = _Builder(pipeline, store, executor, progress)
    started = time.time()
    tokenizer_path = pipeline.tokenizer_path()
    info = describe_tokenizer(tokenizer_path, pipeline.tokenizer.eos, pipeline.tokenizer.encode_special_tokens)

    progress.stage("inputs", "discovering and hashing")
    discovered = discover(pipeline.input.paths, pipeline.base_dir, pipeline.input.format)
    if not _looks_unchanged(store, pipeline, discovered, builder.code, info.sha256):
        executor.warm(WarmUp(str(tokenizer_path), pipeline.tokenizer.eos, pipeline.tokenizer.encode_special_tokens,
                             pipeline.tokenizer.backend))
    sources = _hash_inputs(discovered, executor)
    version = input_version(sources)
    progress.done("inputs", f"{len(sources)} files, {sum(s.size for s in sources) / 1e6:.1f} MB, {version[:19]}")

    settings = TokenizeSettings(str(tokenizer_path), info.sha256, pipeline.tokenizer.eos,
                                pipeline.tokenizer.encode_special_tokens, pipeline.tokenizer.backend,
                                pipeline.input.on_error)
    try:
        entries = builder.tokenize(sources, settings)
    finally:
        release_spool(sources)  # S3 inputs were read once, into the spool; no later stage reads them
    documents_read = sum(int(e["documents"]) for e in entries)
    if documents_read == 0:
        raise InputError(f"{pipeline.source}: the corpus has no documents ({len(sources)} input files)")
    parts = builder.parts(entries)
    tokenize_out = builder.stages["tokenize"].output

    dedup = builder.single("dedup", {"exact": pipeline.dedup.exact}, [tokenize_out],
                           DedupJob(store.url, parts, pipeline.dedup.exact), run_dedup_job)
    keep_id = dedup["outputs"]["keep"]
    formats = pipeline.output.formats
    shuffle_settings = {"seed": pipeline.seed, "shard_size": pipeline.output.shard_size,
                        "dtype": info.dtype, "formats": list(formats)}
    shuffle = builder.single("shuffle", shuffle_settings, [tokenize_out, builder.stages["dedup"].output],
                             ShuffleJob(store.url, parts, keep_id, pipeline.seed, pipeline.output.shard_size,
                                        info.dtype, formats), run_shuffle_job)
    shards = builder.shard(parts, keep_id, shuffle, info.dtype, info.eos_id, executor.workers)

    stats = {
        "documents_read": documents_read,
        "duplicates_dropped": int(dedup["duplicates_dropped"]),
        "documents_written": sum(s["documents"] for s in shards),
        "tokens_written": sum(s["tokens"] for s in shards),
        "bad_records_skipped": sum(int(e.get("bad_records", 0)) for e in entries),
        "special_token_documents": sum(int(e.get("special_token_documents", 0)) for e in entries),
    }
    manifest = {
        "schema": "prep.snapshot/1",
        "dataset": pipeline.dataset,
        "seed": pipeline.seed,
        "inputs": {"version": version, "files": [s.to_json() for s in sources]},
        "code": builder.code,
        "tokenizer": info.to_json(),
        "config": pipeline.resolved(),
        "stages": [{"name": run.name, "key": run.key, "output": run.output} for run in builder.stages.values()],
        "artifacts": _artifacts(shards, formats),
        "stats": stats,
    }
    if lease.lapsed:
        raise StoreError(f"{store.url}: this build's lease lapsed (the store was unreachable too long); "
                         "rerun to publish from the committed work")
    snapshot = publish_manifest(store, manifest)
    crash_point("publish.before_refs")
    moved = [move_ref(store, pipeline.dataset, name, snapshot.id) for name in ("latest", *tags)]
    log_key = _write_log(store, pipeline, snapshot, builder, sources, entries, started, moved)
    progress.info(f"published {snapshot.id} as " + ", ".join(f"{r.dataset}@{r.name} (generation {r.generation})" for r in moved))
    return BuildResult(snapshot, moved, builder.stages, log_key)


def _write_log(store: Store, pipeline: Pipeline, snapshot: Snapshot, builder: _Builder,
               sources: list[SourceFile], entries: list[dict[str, Any]], started: float, moved: list[Ref]) -> str:
    """A build's log record: mutable facts that must not change the snapshot id."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    key = f"{LOGS_PREFIX}{pipeline.dataset}/{stamp}-{uuid.uuid4().hex[:12]}.json"
    record = {
        "schema": "prep.build-log/1",
        "snapshot": snapshot.id,
        "dataset": pipeline.dataset,
        "started": stamp,
        "seconds": int(time.time() - started),
        "host": os.uname().nodename,
        "stages": {n: {"key": r.key, "ran": r.ran, "cached": r.cached} for n, r in builder.stages.items()},
        "inputs": [{"path": s.rel, "location": s.location, "etag": s.etag, "version_id": s.version_id}
                   for s in sources],
        "refs": [{"name": ref.name, "generation": ref.generation, "previous": ref.previous} for ref in moved],
        "bad_records": [reason for e in entries for reason in e.get("bad_record_examples", [])],
        "tasks": builder.log["tasks"],
    }
    store.put_bytes(key, json.dumps(record, sort_keys=True, indent=1).encode())
    return key
