"""Task functions that run in workers: do a stage's pure work, then store its outputs as
content-addressed objects. They never write commit records; the driver does that last."""

from __future__ import annotations

import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep import hashing
from prep.faults import crash_point
from prep.inputs.sources import SourceFile, hash_source
from prep.runner.executors.base import WarmUp
from prep.stages.read import ReadTask
from prep.stages.specs import Part, ShardSpec, TokenizeSettings
from prep.storage import open_store
from prep.storage.base import Store
from prep.store import cas
from prep.store.cache import local_file as fetch_local

# The stage modules (numpy, Arrow, tokenizers) are imported inside the task functions: the
# driver imports this module for the job descriptions and must stay quick to start.

_STORES: dict[str, Store] = {}


def worker_store(url: str) -> Store:
    """One store handle per process (boto3 clients must not cross a fork)."""
    if url not in _STORES:
        _STORES[url] = open_store(url)
    return _STORES[url]


def prepare_worker(warm: WarmUp | None) -> None:
    """Import what tasks need and load the build's tokenizer, so the first task pays for neither."""
    import prep.stages.dedup  # noqa: F401
    import prep.stages.shard  # noqa: F401
    import prep.stages.tokenize  # noqa: F401
    from prep.stages.read import preload_fast_parser
    from prep.tokenizer.backends import gigatoken_available

    gigatoken_available()
    preload_fast_parser()
    if warm is not None:
        from prep.stages.tokenize import warm_engine

        warm_engine(warm.tokenizer_path, warm.eos, warm.encode_special_tokens, warm.backend)


@dataclass(frozen=True)
class PartRef:
    """A committed tokenize output as later tasks receive it (object id instead of a path)."""

    object_id: str
    source: str
    format: str
    line_offset: int
    documents: int

    def resolve(self, store: Store) -> Part:
        return Part(fetch_local(store, self.object_id), self.source, self.format, self.line_offset, self.documents)


@dataclass(frozen=True)
class TaskResult:
    """A task's stored outputs by name, its summary (recorded) and log (build log only).
    `staged` holds outputs the driver stores before committing: name -> (local path, sha256, size)."""

    outputs: dict[str, str]
    summary: dict[str, Any]
    log: dict[str, Any]
    staged: dict[str, tuple[str, str, int]] = field(default_factory=dict)


def publish_staged(store: Store, result: TaskResult) -> TaskResult:
    """Store a result's staged files (the store makes each durable before naming it) and return
    the result with every output stored."""
    outputs = dict(result.outputs)
    try:
        for name, (path, sha256, size) in result.staged.items():
            outputs[name] = cas.put_file(store, Path(path), hashing.Digest(sha256, size)).id
    finally:
        for path, _, _ in result.staged.values():
            Path(path).unlink(missing_ok=True)
    return TaskResult(outputs, result.summary, result.log)


def discard_staged(store: Store, job: object) -> None:
    """Remove what a job that will never be published left in the store's staging folder."""
    if isinstance(job, TokenizeJob) and job.driver_stores:
        (store.staging_dir() / job.staged_name).unlink(missing_ok=True)


@dataclass(frozen=True)
class HashJob:
    """Hash a batch of input files; with `spool`, S3 inputs are also copied to this machine's
    spool for the tokenize tasks (only useful when they run on the same machine)."""

    sources: tuple[SourceFile, ...]
    spool: bool


def run_hash_job(job: HashJob) -> list[SourceFile]:
    with ThreadPoolExecutor(max_workers=min(2, len(job.sources)) or 1) as pool:
        return list(pool.map(lambda source: hash_source(source, job.spool), job.sources))


@dataclass(frozen=True)
class TokenizeJob:
    """Tokenize one read task. With `driver_stores`, the intermediate is left in the store's
    staging folder for the driver to store: the fsync that makes it durable then waits in the
    driver, not in a worker that could be tokenizing the next task."""

    store_url: str
    task: ReadTask
    settings: TokenizeSettings
    driver_stores: bool = False
    staged_name: str = field(default_factory=lambda: f"tokenize-{uuid.uuid4().hex}.part")


def run_tokenize_job(job: TokenizeJob) -> TaskResult:
    from prep.stages.tokenize import run_tokenize

    store = worker_store(job.store_url)
    result = run_tokenize(job.task, job.settings, store.staging_dir() / job.staged_name, durable=not job.driver_stores)
    if job.driver_stores:
        crash_point("tokenize.after_output")
        staged = (str(result.path), result.digest.sha256, result.digest.size)
        return TaskResult({}, result.summary, result.log, {"intermediate": staged})
    try:
        digest = cas.put_file(store, result.path, result.digest)
    finally:
        result.path.unlink(missing_ok=True)
    crash_point("tokenize.after_output")
    return TaskResult({"intermediate": digest.id}, result.summary, result.log)


@dataclass(frozen=True)
class DedupJob:
    store_url: str
    parts: tuple[PartRef, ...]
    exact: bool


def run_dedup_job(job: DedupJob) -> TaskResult:
    from prep.stages.dedup import check_unique_ids, keep_mask, pack_mask, read_hashes

    store = worker_store(job.store_url)
    by_source: dict[str, list[PartRef]] = {}
    for ref in job.parts:
        by_source.setdefault(ref.source, []).append(ref)
    for source, refs in by_source.items():
        if len(refs) > 1:
            check_unique_ids(source, (ref.resolve(store).path for ref in refs))
    keep = keep_mask((read_hashes(ref.resolve(store).path) for ref in job.parts), job.exact)
    digest = cas.put_bytes(store, pack_mask(keep))
    return TaskResult({"keep": digest.id},
                      {"documents_read": len(keep), "duplicates_dropped": int(len(keep) - keep.sum())}, {})


@dataclass(frozen=True)
class ShuffleJob:
    store_url: str
    parts: tuple[PartRef, ...]
    keep_id: str
    seed: int
    shard_size: int
    dtype: str
    formats: tuple[str, ...]


def run_shuffle_job(job: ShuffleJob) -> TaskResult:
    import numpy as np

    from prep.stages.dedup import unpack_mask
    from prep.stages.shuffle import plan_bytes, plan_shards

    store = worker_store(job.store_url)
    keep = unpack_mask(cas.get_bytes(store, job.keep_id))
    parts = [ref.resolve(store) for ref in job.parts]
    plan, shards = plan_shards(parts, keep, job.seed, job.shard_size, np.dtype(job.dtype), job.formats)
    digest = cas.put_bytes(store, plan_bytes(plan))
    return TaskResult({"plan": digest.id}, {"shards": [spec.to_json() for spec in shards]}, {})


@dataclass(frozen=True)
class AssembleJob:
    """Write some units of some shards (see prep.stages.shard) and store their files.
    `units` pairs a shard with "bin" (its .bin and .idx) or "wds" (its .tar)."""

    store_url: str
    parts: tuple[PartRef, ...]
    keep_id: str
    plan_id: str
    units: tuple[tuple[ShardSpec, str], ...]
    dtype: str
    eos_id: int


def run_assemble_job(job: AssembleJob) -> TaskResult:
    """Outputs are keyed `<shard>/<format>`; one metadata pass serves every unit of the job."""
    import numpy as np

    from prep.stages.dedup import unpack_mask
    from prep.stages.shard import PartReader, collect_documents, write_unit
    from prep.stages.shuffle import plan_from_bytes

    store = worker_store(job.store_url)
    keep = unpack_mask(cas.get_bytes(store, job.keep_id))
    plan = plan_from_bytes(cas.get_bytes(store, job.plan_id))
    parts = [ref.resolve(store) for ref in job.parts]
    shards = sorted({spec.index for spec, _ in job.units})
    documents = collect_documents(parts, keep, plan, shards, with_json=any(unit == "wds" for _, unit in job.units))
    work_dir = store.staging_dir() / f"assemble-{uuid.uuid4().hex}"
    work_dir.mkdir(parents=True)
    reader = PartReader(parts)
    outputs: dict[str, str] = {}
    sizes: dict[str, int] = {}
    try:
        for spec, unit in job.units:
            written = write_unit(unit, spec, documents[spec.index], reader, np.dtype(job.dtype), job.eos_id, work_dir)
            crash_point("shard.after_write")
            for fmt, (path, digest) in sorted(written.items()):
                cas.put_file(store, path, digest)
                crash_point("shard.between_puts")
                outputs[f"{spec.index}/{fmt}"] = digest.id
                sizes[f"{spec.index}/{fmt}"] = digest.size
                path.unlink()
        return TaskResult(outputs, {"sizes": sizes}, {})
    finally:
        reader.close()
        shutil.rmtree(work_dir, ignore_errors=True)
