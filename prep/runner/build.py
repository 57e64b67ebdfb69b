"""`prep build`: hash the inputs, run the build's stages, publish the snapshot.

Stages (prep/runner/stage.py, run by prep/runner/driver.py): tokenize (read, document steps,
tokenize: one task per file part) -> order (exact dedup and key order, one task per key bucket,
the parts merged first when they are many) -> shard (content-defined shards in each output
format) -> publish (snapshot manifest, read-back of every object it names, then refs by
compare-and-swap from the generations seen when the build started; see prep/runner/publish.py).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prep.code import code_identity
from prep.config import Pipeline
from prep.errors import InputError, StoreError, UsageError
from prep.faults import crash_point
from prep.hashing import Digest
from prep.inputs.sources import SourceFile, discover, input_version, release_spool
from prep.progress import Progress, human_bytes, plural
from prep.quality.gate import CheckResult, failure, judge
from prep.runner.distributions import measures
from prep.runner.driver import Runner
from prep.runner.executors.base import Executor, WarmUp, WrappedExecutor
from prep.runner.executors.pool import LocalExecutor
from prep.runner.nearbuckets import NearBuckets
from prep.runner.nearclusters import NearClusters
from prep.runner.ordering import Ordering
from prep.runner.planning import (
    describe_inputs,
    hash_inputs_meanwhile,
    read_exclusions,
    tokenize_settings,
    unchanged_latest,
)
from prep.runner.publish import (
    BuildFacts,
    RefOutcome,
    RefPlan,
    build_stats,
    publish_refs,
    snapshot_manifest,
    step_stats,
    write_log,
)
from prep.runner.readback import Readback, passed_before, read_back
from prep.runner.reuse import executor_checker
from prep.runner.sharding import Sharded, Sharding
from prep.runner.stage import Stage, StageRun
from prep.runner.tasks import CodeChecked, prepare_worker
from prep.runner.tokenizing import Tokenized, Tokenizing
from prep.stages.specs import TokenizeSettings
from prep.steps.protocol import DocumentStep
from prep.steps.stepsources import step_sources
from prep.storage.backend import Store
from prep.store import cas, snapshots
from prep.store.leases import Lease, build_lease, waiting_for_gc
from prep.store.retention import record_policy
from prep.store.snapshots import Snapshot
from prep.store.tags import check_tag_name
from prep.tokenizer import TokenizerInfo, describe_tokenizer, read_tokenizer_file


@dataclass
class BuildResult:
    """A finished build: its snapshot, what it did to each ref, its stages, log and read-back."""

    snapshot: Snapshot
    refs: list[RefOutcome]
    stages: dict[str, StageRun] = field(default_factory=dict)
    log_key: str = ""
    readback: Readback = field(default_factory=lambda: Readback(False))
    checks: list[CheckResult] = field(default_factory=list)  # [checks] judged (all passed), none when not declared


def make_executor(kind: str, workers: int, ray_address: str | None = None) -> Executor:
    """The executor named by `--executor`; local workers start (and import the task modules) at
    once, forked from this process when it runs no other thread."""
    if kind == "local":
        return LocalExecutor(workers, prepare_worker, fork=True)
    if kind == "ray":
        from prep.runner.executors.ray import RayExecutor

        return RayExecutor(workers, ray_address)
    raise UsageError(f"unknown executor {kind!r} (use local or ray)")


@dataclass(frozen=True)
class PublishOptions:
    """How a build publishes: `--tag`s, `--expect` (the generation `latest` must be at), `--force`
    (move refs another publisher moved meanwhile, and tags that name other snapshots), and
    whether to read the snapshot back before any ref moves (`--no-readback` turns it off)."""

    tags: tuple[str, ...] = ()
    expect: int | None = None
    force: bool = False
    readback: bool = True


def build(pipeline: Pipeline, store: Store, executor: Executor, tags: Sequence[str] = (),
          progress: Progress | None = None, options: PublishOptions | None = None) -> BuildResult:
    """Run the pipeline into `store` and publish it; returns the snapshot and moved refs.

    The whole build holds a build lease, so garbage collection never runs while this build may
    still commit what it found in the store (docs/history.md). Every task runs behind the
    driver's code-identity check (`runner.tasks.CodeChecked`)."""
    options = options or PublishOptions()
    if tags:
        options = replace(options, tags=tuple(tags))
    for tag in options.tags:
        check_tag_name(tag)
    code = code_identity()
    checked = WrappedExecutor(executor, lambda fn: CodeChecked(fn, code))
    plan = RefPlan.note(store, pipeline.dataset, options.tags, options.expect, options.force)
    progress = progress or Progress()
    with build_lease(store, on_wait=lambda key: progress.info(waiting_for_gc(key))) as lease:
        result = _build(pipeline, store, checked, progress, lease,
                        Publishing(options, plan, getattr(executor, "backend", type(executor).__name__)))
        # what prep gc keeps of this dataset; under the lease, so no gc plans with the old policy
        record_policy(store, pipeline.dataset, pipeline.retention)
    return result


@dataclass(frozen=True)
class Publishing:
    """A build's publish options with the refs' generations noted at its start and the executor's name."""

    options: PublishOptions
    plan: RefPlan
    backend: str


def store_tokenizer(store: Store, path: Path, sha256: str) -> Digest:
    """Store the tokenizer file the build used as an object, so a snapshot carries what decodes
    its tokens (prep pull puts it beside the shards); InputError if it is no longer that file."""
    try:
        data = read_tokenizer_file(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the tokenizer file again: {exc.strerror or exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"{path}: tokenizer file changed during the build")
    return cas.put_bytes(store, data)


def store_step_sources(store: Store, steps: Sequence[DocumentStep]) -> list[dict[str, Any]]:
    """Store the files of the function steps' packages as objects, so a snapshot carries the code
    `prep rebuild` imports again; the manifest's `step_sources` entries, by path (none: [])."""
    entries = []
    for source in step_sources(steps):
        stored = cas.put_bytes(store, source.data)
        entries.append({"module": source.module, "path": source.path, "object": stored.id, "bytes": stored.size})
    return entries


@dataclass(frozen=True)
class Built:
    """A build's snapshot manifest before it is published, with the inputs and tokenize result its log records."""

    manifest: dict[str, Any]
    sources: list[SourceFile]
    tokenized: Tokenized
    checks: list[CheckResult]  # the pipeline's [checks], all passed (none without [checks])


KERNEL_INPUT_BYTES = 64 * 2**20
"""A near-dup build's input size from which its workers load the compiled MinHash kernel while the
driver starts (prep.neardup.kernel: about 1 s of a core each, which the signatures of 64 MB repay)."""

def run_pipeline(pipeline: Pipeline, runner: Runner, on_latest: Callable[[bool], None] = lambda found: None) -> Built:
    """Hash the inputs, run every stage, store what the snapshot carries and make its manifest; publishes
    nothing. `on_latest` hears whether `latest` looks unchanged, before any task runs."""
    store, executor, progress, code = runner.store, runner.executor, runner.progress, dict(runner.code)
    tokenizer_path = pipeline.tokenizer_path()
    info = describe_tokenizer(tokenizer_path, pipeline.tokenizer.eos, pipeline.tokenizer.encode_special_tokens)
    exclusions = read_exclusions(pipeline)

    progress.stage("inputs", "discovering and hashing")
    discovered = discover(pipeline.input.paths, pipeline.base_dir, pipeline.input.format)
    latest = unchanged_latest(store, pipeline, discovered, code, info.sha256)
    on_latest(latest is not None)
    if latest is None:
        minhash = pipeline.dedup.near is not None and sum(source.size for source in discovered) >= KERNEL_INPUT_BYTES
        executor.warm(WarmUp(str(tokenizer_path), info.sha256, pipeline.tokenizer.eos,
                             pipeline.tokenizer.encode_special_tokens, pipeline.tokenizer.backend, minhash))
    sources = hash_inputs_meanwhile(discovered, executor, _precheck(runner, latest))
    version = input_version(sources)
    progress.done("inputs", f"{plural(len(sources), 'file')}, {human_bytes(sum(s.size for s in sources))}, {version[:19]}")

    settings = tokenize_settings(pipeline, str(tokenizer_path), info.sha256, exclusions)
    try:
        tokenized = runner.run_stage(Tokenizing(tuple(sources), settings, pipeline.input.text_field,
                                                pipeline.input.id_field, pipeline.input.max_document_bytes,
                                                pipeline.input.metadata_fields,
                                                exclusion_table=exclusions.table if exclusions else None), None)
    finally:
        release_spool(sources)  # S3 inputs were read once, into the spool; no later stage reads them
    _check_not_empty(pipeline, sources, tokenized)
    sharded: Sharded = runner.run_stages(global_stages(pipeline, info, settings), tokenized)
    stats = build_stats(sharded)
    checked = judge_checks(pipeline, stats, progress)
    stored = store_tokenizer(store, tokenizer_path, info.sha256)
    tokenizer = {**info.to_json(), "object": stored.id, "bytes": stored.size}
    manifest = snapshot_manifest(
        dataset=pipeline.dataset, seed=pipeline.seed, version=version, sources=sources, code=code,
        tokenizer=tokenizer, config=pipeline.resolved(), stages=runner.committed_stages(), shards=sharded.shards,
        formats=pipeline.output.formats, stats=stats,
        checks=[result.to_json() for result in checked] if pipeline.checks else None,
        step_sources=store_step_sources(store, pipeline.steps), exclusions=exclusions)
    return Built(manifest, sources, tokenized, checked)


def check_lease(store: Store, lease: Lease) -> None:
    """StoreError when the build's lease lapsed: gc may have run, so nothing it made may be published."""
    if lease.lapsed:
        raise StoreError(f"{store.url}: this build's lease lapsed (the store was unreachable too long); "
                         "rerun to publish from the committed work")


def _build(pipeline: Pipeline, store: Store, executor: Executor, progress: Progress, lease: Lease,
           publishing: Publishing) -> BuildResult:
    runner = Runner(store, executor, progress, code_identity(), publishing.options.readback)
    started = time.time()
    built = run_pipeline(pipeline, runner, publishing.plan.check_expect)
    check_lease(store, lease)
    snapshot = snapshots.publish_manifest(store, built.manifest)
    crash_point("publish.before_refs")
    readback, outcomes = _publish(runner, snapshot, publishing)
    extra = {"tasks": runner.logs, **({"recomputed": runner.guard.recomputed} if runner.guard.recomputed else {})}
    facts = BuildFacts(started, publishing.backend, executor.workers, readback.to_json(), outcomes)
    try:
        log_key = write_log(store, pipeline.dataset, snapshot, runner.stages, built.sources, built.tokenized.parts,
                            facts, extra)
    except StoreError as exc:  # the refs moved already: the build did publish, only its log is lost
        progress.info(f"warning: the build log could not be stored ({exc}); the snapshot is published")
        log_key = ""
    return BuildResult(snapshot, outcomes, runner.stages, log_key, readback, built.checks)


def judge_checks(pipeline: Pipeline, stats: dict[str, Any], progress: Progress) -> list[CheckResult]:
    """The pipeline's [checks] judged on the build's stats; ChecksFailedError (exit 2) naming
    every one that failed, before anything is published: the stages' task records and objects stay
    committed, so a rerun with the limits or the corpus fixed reuses them."""
    if not pipeline.checks:
        return []
    results = judge(pipeline.checks, measures(stats))
    error = failure(pipeline.source, results)
    if error is not None:
        raise error
    progress.info(f"checks: all {len(results)} passed")
    return results


def global_stages(pipeline: Pipeline, info: TokenizerInfo, settings: TokenizeSettings) -> list[Stage[Any, Any]]:
    """The stages after tokenize, in order: each partitioned, so no task holds the corpus; with
    [dedup.near], the near-duplicate bucket and cluster stages before order."""
    near: list[Stage[Any, Any]] = []
    if pipeline.dedup.near is not None:
        near = [NearBuckets(pipeline.dedup.near), NearClusters()]
    return [*near, Ordering(pipeline.dedup.exact, pipeline.output.shard_size, info.dtype, pipeline.build.merge_fan_in),
            Sharding(pipeline.output.formats, pipeline.output.shard_size, info.dtype, info.eos_id, settings)]


def _check_not_empty(pipeline: Pipeline, sources: list[SourceFile], tokenized: Tokenized) -> None:
    """An InputError when no document is left to order (none read, or the steps dropped all)."""
    if tokenized.documents:
        return
    dropped = sum(counts.dropped for counts in step_stats(tokenized.parts))
    by_steps = f" left by [[steps]] (they dropped all {dropped} read)" if dropped else ""
    raise InputError(f"{pipeline.source}: the corpus has no documents{by_steps} in {len(sources)} input "
                     f"file{'s' if len(sources) != 1 else ''}: {describe_inputs(sources)}")


def _precheck(runner: Runner, latest: Snapshot | None) -> Callable[[], object] | None:
    """For a rebuild that looks unchanged, on a pool sharing this machine (the driver's threads
    hash the inputs meanwhile): re-hash the latest snapshot's artifacts on the workers now, so
    that when the shard stage reuses them they are trusted instead of checked after everything."""
    if latest is None or not runner.executor.shares_filesystem:
        return None
    object_ids = sorted({f"sha256:{artifact['sha256']}" for artifact in latest.artifacts})
    return lambda: runner.guard.find_bad(object_ids)


def _publish(runner: Runner, snapshot: Snapshot, publishing: Publishing) -> tuple[Readback, list[RefOutcome]]:
    """Read the snapshot back (unless told not to, or no ref would move), then move the refs."""
    store, progress, plan = runner.store, runner.progress, publishing.plan
    pending = plan.pending(store, snapshot.id)
    readback = Readback(False, skipped="no ref moves" if not pending else "--no-readback")
    if pending and publishing.options.readback:
        # What this build stored or recomputed is read back even if a record says it passed (gc
        # may have collected the object since, and this build stored it again).
        rewritten = runner.guard.stored | {str(item["object"]) for item in runner.guard.recomputed}
        readback = read_back(store, snapshot, executor_checker(store, runner.executor),
                             passed_before(store, plan.latest_snapshot), rewritten, runner.guard.read_back)
    if pending:
        progress.info(readback.summary())
    outcomes = publish_refs(store, plan, snapshot.id, progress.info)
    moved = [o for o in outcomes if o.action == "moved"]
    if not moved and all(o.action == "unchanged" for o in outcomes):
        progress.info(f"up to date: {snapshot.id} is already " +
                      ", ".join(f"{plan.dataset}@{o.name} (generation {o.generation})" for o in outcomes))
    elif moved:
        progress.info(f"published {snapshot.id} as " +
                      ", ".join(f"{plan.dataset}@{o.name} (generation {o.generation})" for o in moved))
    return readback, outcomes
