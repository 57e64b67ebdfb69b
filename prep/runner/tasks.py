"""Task functions that run in workers: do a stage's pure work, then store its outputs as
content-addressed objects. They never write commit records; the driver does that last."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep import hashing
from prep.code import code_identity, describe_code
from prep.errors import ForeignCodeError
from prep.faults import crash_point
from prep.formats.registry import output_format
from prep.inputs.sources import SourceFile, hash_source
from prep.runner.executors.base import WarmUp
from prep.stages.cuts import ShardPlan
from prep.stages.read import ReadTask
from prep.stages.specs import Part, PartTable, ShardParts, TokenizeSettings, entries_path
from prep.storage import open_store
from prep.storage.base import Store
from prep.store import cas
from prep.store.localcopy import local_file as fetch_local

# The stage modules (numpy, Arrow, tokenizers) are imported inside the task functions: the
# driver imports this module for the job descriptions and must stay quick to start.

_STORES: dict[str, Store] = {}


def worker_store(url: str) -> Store:
    """One store handle per process (boto3 clients must not cross a fork)."""
    if url not in _STORES:
        _STORES[url] = open_store(url)
    return _STORES[url]


def check_code(driver: dict[str, object]) -> None:
    """Refuse to run a task for a driver whose code identity is not this worker's own: the task's
    bytes would be committed under keys that name the driver's code."""
    own = code_identity()
    if own != driver:
        raise ForeignCodeError(f"worker on host {socket.gethostname()} runs {describe_code(own)}, the driver "
                               f"{describe_code(driver)}; it refuses the task (run the driver's prep and "
                               "libraries on every node)")


@dataclass(frozen=True)
class CodeChecked:
    """The entry point of every task: checks the worker's code identity against the driver's
    (carried with the task) before running `fn`."""

    fn: Callable[[Any], Any]
    code: dict[str, object]

    def __call__(self, item: Any) -> Any:
        check_code(self.code)
        return self.fn(item)


def prepare_worker(warm: WarmUp | None) -> None:
    """Import what tasks need and load the build's tokenizer, so the first task pays for neither."""
    import prep.stages.keepmask  # noqa: F401
    import prep.stages.shard  # noqa: F401
    import prep.stages.tokenize  # noqa: F401
    from prep.stages.read import preload_fast_parser
    from prep.tokenizer.backends import gigatoken_available

    gigatoken_available()
    preload_fast_parser()
    if warm is not None:
        from prep.stages.tokenize import warm_engine

        warm_engine(warm.tokenizer_path, warm.tokenizer_sha256, warm.eos, warm.encode_special_tokens, warm.backend)


@dataclass(frozen=True)
class PartRef:
    """A committed tokenize output as later tasks receive it (object id instead of a path)."""

    object_id: str
    source: str
    format: str
    line_offset: int
    documents: int
    entries_id: str  # the part's entries object (prep.stages.entries)

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
    read_back: tuple[tuple[str, cas.FileStamp], ...] = ()
    """Stored outputs the task read back from the store's own file on disk as it wrote them
    (prep.stages.sink), with that file's stamp once stored."""


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
    return TaskResult(outputs, result.summary, result.log, read_back=result.read_back)


def discard_staged(store: Store, job: object) -> None:
    """Remove what a job that will never be published left in the store's staging folder."""
    if isinstance(job, TokenizeJob) and job.driver_stores:
        staged = store.staging_dir() / job.staged_name
        for path in (staged, entries_path(staged)):
            path.unlink(missing_ok=True)


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
    files = {"intermediate": (result.path, result.digest)}
    if result.entries is not None:
        files["entries"] = result.entries
    if job.driver_stores:
        crash_point("tokenize.after_output")
        staged = {name: (str(path), digest.sha256, digest.size) for name, (path, digest) in files.items()}
        return TaskResult({}, result.summary, result.log, staged)
    try:
        outputs = {name: cas.put_file(store, path, digest).id for name, (path, digest) in files.items()}
    finally:
        for path, _ in files.values():
            path.unlink(missing_ok=True)
    crash_point("tokenize.after_output")
    return TaskResult(outputs, result.summary, result.log)


@dataclass(frozen=True)
class MergeJob:
    """Merge consecutive entries objects (parts' or runs') into one run: each input is an object
    id with its first part's ordinal counted from the first input's."""

    store_url: str
    inputs: tuple[tuple[str, int], ...]
    documents: int


def run_merge_job(job: MergeJob) -> TaskResult:
    from prep.stages.merge import merge_runs
    from prep.stages.tokenize import drop_engines

    drop_engines()
    store = worker_store(job.store_url)
    inputs = [(fetch_local(store, object_id), first) for object_id, first in job.inputs]
    stored, summary = _store_written(store, "merge", lambda staged: merge_runs(inputs, staged))
    return TaskResult({"run": stored}, summary, {})


def _store_written(store: Store, stage: str,
                   write: Callable[[Path], tuple[hashing.Digest, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """Have `write` make one file in the store's staging folder, store it and return its object
    id with `write`'s summary; the staged file never outlives the call, stored or not."""
    staged = store.staging_dir() / f"{stage}-{uuid.uuid4().hex}.part"
    try:
        digest, summary = write(staged)
        crash_point(f"{stage}.after_write")
        return cas.put_file(store, staged, digest).id, summary
    finally:
        staged.unlink(missing_ok=True)


@dataclass(frozen=True)
class OrderJob:
    """Dedup, sort and cut one key bucket: reads the bucket's entries from `sources`, the parts'
    entries objects or the runs merged from them, each with its first part's ordinal; `parts`
    has every part's source and line offset, which leaf digests name. `check_ids` lists files split into
    several parts whose ids this task checks across the parts (ids must be unique within a
    file; each tokenize task checked its own part): a file's parts are in the tokenize stage
    manifest, so the task's key covers them. The key does not cover `sources`: runs or parts,
    the bucket's entries are the same."""

    store_url: str
    parts: PartTable
    bucket: int
    bits: int
    exact: bool
    shard_size: int
    itemsize: int
    sources: tuple[tuple[str, int], ...]
    check_ids: tuple[tuple[PartRef, ...], ...] = ()


def run_order_job(job: OrderJob) -> TaskResult:
    from prep.stages.idcheck import check_unique_ids
    from prep.stages.order import order_bucket
    from prep.stages.tokenize import drop_engines

    drop_engines()
    store = worker_store(job.store_url)
    for same_file in job.check_ids:
        check_unique_ids(same_file[0].source, [ref.resolve(store).path for ref in same_file], store.staging_dir())
    sources = [(fetch_local(store, object_id), first_part) for object_id, first_part in job.sources]
    stored, summary = _store_written(store, "order", lambda staged: order_bucket(
        sources, job.parts, job.bucket, job.bits, job.exact, job.shard_size, job.itemsize, staged))
    return TaskResult({"bucket": stored}, summary, {})


@dataclass(frozen=True)
class AssembleJob:
    """Write some units of some shards (see prep.stages.shard) and store their files.
    `units` pairs a shard with an output format (prep.formats.registry: "bin", "wds"); `buckets` names
    the bucket object of every bucket the shards' slices read; `parts` has every part's
    intermediate, source and line offset, packed; `read_back` False (a build run with
    `--no-readback`) writes the files without reading them back from the disk."""

    store_url: str
    parts: ShardParts
    buckets: tuple[tuple[int, str], ...]
    units: tuple[tuple[ShardPlan, str], ...]
    dtype: str
    eos_id: int
    read_back: bool = True


def run_assemble_job(job: AssembleJob) -> TaskResult:
    """Outputs are keyed `<shard name>/<format>`."""
    import numpy as np

    from prep.stages.members import PartNames
    from prep.stages.shard import PartReader, collect_shard, write_unit
    from prep.stages.tokenize import drop_engines

    drop_engines()
    store = worker_store(job.store_url)
    names = PartNames.of(job.parts)
    reader = PartReader([fetch_local(store, object_id) for object_id in job.parts.object_ids()])
    buckets = {bucket: fetch_local(store, object_id) for bucket, object_id in job.buckets}
    work_dir = store.staging_dir() / f"assemble-{uuid.uuid4().hex}"
    work_dir.mkdir(parents=True)
    outputs: dict[str, str] = {}
    sizes: dict[str, int] = {}
    read_back: list[tuple[str, cas.FileStamp]] = []
    try:
        for plan, unit in job.units:
            spec = output_format(unit)
            documents = collect_shard(plan, buckets, names, spec.needs_json, spec.needs_ids)
            written = write_unit(unit, plan, documents, reader, np.dtype(job.dtype), job.eos_id, work_dir,
                                 job.read_back)
            crash_point("shard.after_write")
            for fmt, file in sorted(written.items()):
                cas.put_file(store, file.path, file.digest)
                crash_point("shard.between_puts")
                outputs[f"{plan.name}/{fmt}"] = file.digest.id
                sizes[f"{plan.name}/{fmt}"] = file.digest.size
                staged = os.stat(file.path) if file.read_back else None
                file.path.unlink()
                stamp = cas.file_stamp(store, file.digest.id) if staged else None
                if staged is not None and stamp is not None and stamp.same_file(staged):  # stored as this very file
                    read_back.append((file.digest.id, stamp))
        return TaskResult(outputs, {"sizes": sizes}, {}, read_back=tuple(read_back))
    finally:
        reader.close()
        shutil.rmtree(work_dir, ignore_errors=True)
