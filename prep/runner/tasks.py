"""What every task shares on a worker: the store handle, the code-identity check at its entry,
the warm-up, its result (outputs stored as content-addressed objects, never commit records: the
driver writes those last) and the input-hashing job. Each stage's own job and task function live
in its module (prep/runner/tokenizing.py, merging.py, ordering.py, sharding.py)."""

from __future__ import annotations

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
from prep.inputs.sources import SourceFile, hash_source
from prep.runner.executors.base import WarmUp
from prep.storage import open_store
from prep.storage.backend import Store
from prep.store import cas

# The stage modules (numpy, Arrow, tokenizers) are imported inside the task functions: the
# driver imports this module for the job descriptions and must stay quick to start.

_STORES: dict[str, Store] = {}


def worker_store(url: str) -> Store:
    """One store handle per process (boto3 clients must not cross a fork)."""
    if url not in _STORES:
        _STORES[url] = open_store(url)
    return _STORES[url]


_TABLES: dict[str, bytes] = {}
TABLES_KEPT = 2  # a worker runs one stage's tasks at a time: the tables of the last two suffice


def stored_table(store: Store, object_id: str) -> bytes:
    """A packed table a job names by object id (prep.runner.stage.TaskPlan.tables), read and
    checked once per process, so a job carries 71 bytes instead of tens of bytes a part."""
    if object_id not in _TABLES:
        while len(_TABLES) >= TABLES_KEPT:
            del _TABLES[next(iter(_TABLES))]
        _TABLES[object_id] = cas.get_bytes(store, object_id)
    return _TABLES[object_id]


@dataclass(frozen=True)
class TableJob:
    """Store a packed table again (a build found it bad while a task it reuses must be remade)."""

    store_url: str
    data: bytes


def run_table_job(job: TableJob) -> TaskResult:
    return TaskResult({"table": cas.put_bytes(worker_store(job.store_url), job.data).id}, {}, {})


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
    import prep.stages.shard  # noqa: F401
    import prep.stages.tokenize  # noqa: F401
    from prep.stages.read import preload_fast_parser
    from prep.tokenizer.backends import gigatoken_available

    gigatoken_available()
    preload_fast_parser()
    if warm is not None:
        from prep.stages.tokenize import warm_engine

        warm_engine(warm.tokenizer_path, warm.tokenizer_sha256, warm.eos, warm.encode_special_tokens, warm.backend)
    if warm is not None and warm.minhash:
        from prep.neardup.kernel import compiled
        from prep.neardup.normalization import case_table

        if compiled() is not None:
            case_table()  # what the compiled normalization reads once a batch holds a non-ASCII byte


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
    aliases: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = ()
    """Other task records its outputs answer: (stage, key, (name there, name of its output) pairs), committed with it
    (a tokenize task's step outcomes, found again by a build that changes a later step)."""


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
    return TaskResult(outputs, result.summary, result.log, read_back=result.read_back, aliases=result.aliases)


@dataclass(frozen=True)
class BatchResult:
    """The results of a job of several tasks (the shard stage's units), by task key."""

    results: tuple[tuple[str, TaskResult], ...]


JobResult = TaskResult | BatchResult


@dataclass(frozen=True)
class HashJob:
    """Hash a batch of input files; with `spool`, S3 inputs are also copied to this machine's
    spool for the tokenize tasks (only useful when they run on the same machine)."""

    sources: tuple[SourceFile, ...]
    spool: bool


def run_hash_job(job: HashJob) -> list[SourceFile]:
    with ThreadPoolExecutor(max_workers=min(2, len(job.sources)) or 1) as pool:
        return list(pool.map(lambda source: hash_source(source, job.spool), job.sources))


def store_written(store: Store, stage: str,
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
