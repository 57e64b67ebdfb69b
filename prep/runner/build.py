"""`prep build`: plan every stage, skip what is committed, run the rest, publish the snapshot.

Stages: tokenize (read + hash + tokenize, one task per file part) -> dedup (global decisions over
text hashes) -> shuffle (plan of every output byte) -> shard (assemble groups of shards) ->
publish (snapshot manifest, read-back of every object it names, then refs by compare-and-swap
from the generations seen when the build started; see prep/runner/publish.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import Any

from prep.code import code_identity
from prep.config import Pipeline
from prep.errors import InputError, IntegrityError, NotFoundError, StoreError, UsageError
from prep.faults import crash_point
from prep.inputs.sources import SourceFile, discover, input_version, release_spool
from prep.progress import Progress, human_bytes, plural
from prep.runner import ordering
from prep.runner.executors.base import Executor, WarmUp, WrappedExecutor
from prep.runner.executors.local import LocalExecutor
from prep.runner.planning import (
    describe_inputs,
    hash_inputs_meanwhile,
    task_bytes,
    tokenize_settings,
    unchanged_latest,
)
from prep.runner.publish import (
    BuildFacts,
    RefOutcome,
    RefPlan,
    StageRun,
    build_stats,
    publish_refs,
    snapshot_manifest,
    stage_counts,
    step_stats,
    write_log,
)
from prep.runner.readback import Readback, passed_before, read_back
from prep.runner.reuse import Remake, ReuseGuard, executor_checker
from prep.runner.tasks import (
    CodeChecked,
    PartRef,
    TaskResult,
    TokenizeJob,
    discard_staged,
    prepare_worker,
    publish_staged,
    run_tokenize_job,
)
from prep.stages.read import ReadTask, plan_read_tasks
from prep.stages.specs import TokenizeSettings
from prep.storage.base import Store
from prep.store import cas, records, snapshots
from prep.store.layout import task_record_key
from prep.store.leases import Lease, build_lease, waiting_for_gc
from prep.store.retention import record_policy
from prep.store.snapshots import Snapshot
from prep.store.tags import check_tag_name
from prep.tokenizer import describe_tokenizer


@dataclass
class BuildResult:
    """A finished build: its snapshot, what it did to each ref, its stages, log and read-back."""

    snapshot: Snapshot
    refs: list[RefOutcome]
    stages: dict[str, StageRun] = field(default_factory=dict)
    log_key: str = ""
    readback: Readback = field(default_factory=lambda: Readback(False))


class StoringGuard(ReuseGuard):
    """The reuse guard, also keeping what this build stored: read back before a publish even
    when a read-back record says the snapshot passed (the object may have been collected since)."""

    def __init__(self, store: Store, executor: Executor, progress: Progress) -> None:
        super().__init__(store, executor, progress)
        self.stored: set[str] = set()
        self.read_back: dict[str, cas.FileStamp] = {}

    def produced(self, object_ids: Iterable[str]) -> None:
        listed = list(object_ids)
        self.stored.update(listed)
        super().produced(listed)

    def read_back_when_written(self, stamped: Iterable[tuple[str, cas.FileStamp]]) -> None:
        """Objects whose writer read the store's own file back from the disk (prep.stages.sink),
        with the stamp that file had once stored."""
        listed = dict(stamped)
        self.read_back.update(listed)
        self.proved(listed)


class Builder:
    """One build's state and the machinery every stage uses: run tasks, skip committed ones, commit.
    `read_back` False (`--no-readback`): shard files are written without a read-back from the disk."""

    def __init__(self, pipeline: Pipeline, store: Store, executor: Executor, progress: Progress,
                 read_back: bool = True) -> None:
        self.pipeline, self.store, self.executor, self.progress = pipeline, store, executor, progress
        self.read_back = read_back
        self.code = code_identity()
        self.stages: dict[str, StageRun] = {}
        self.log: dict[str, Any] = {"tasks": {}}
        self.guard = StoringGuard(store, executor, progress)
        self.tokenize_settings: TokenizeSettings | None = None

    # -- generic task running ---------------------------------------------------------------
    def run_tasks(self, stage: str, jobs: Sequence[tuple[str, Any]], fn: Callable[[Any], TaskResult],
                  nbytes: Callable[[Any], int] = lambda job: 0, describe: Callable[[Any], str] | None = None,
                  reads: Sequence[Sequence[str]] = (),
                  weight: Callable[[Any], int] | None = None,
                  inputs_of: Callable[[Any], Sequence[str]] = lambda job: (),
                  found: Mapping[str, records.TaskRecord | None] | None = None) -> dict[str, records.TaskRecord]:
        """Run every job whose task record is missing; return every task's record by key.
        `found` holds records (or None: missing) the caller read already, not read again.
        Outputs of found records are registered as reused: checked before anything reads them,
        and recomputed (after checking the job's `inputs_of`) when bad;
        `reads` are the objects the jobs read, checked (in groups, in order) before any job runs.
        Jobs start largest first by `weight` (default: `nbytes`), so the stage ends with small ones."""
        run = self.stages.setdefault(stage, StageRun(stage))
        committed: dict[str, records.TaskRecord] = {}
        todo: list[tuple[str, Any]] = []
        for key, job in jobs:
            record = found[key] if found is not None and key in found else records.read_task_record(self.store, stage, key)
            if record is None:
                todo.append((key, job))
            else:
                committed[key] = record
                what = describe(job) if describe else f"{stage} output"
                self.guard.reused(record.outputs.values(), Remake(what, fn, job, tuple(inputs_of(job))))
        run.cached += len(committed)
        size = weight or nbytes
        todo.sort(key=lambda item: -size(item[1]))  # largest first: less idle time at the end
        for group in reads if todo else ():
            self.guard.ensure(group)
        done_bytes = 0
        self.progress.tick(stage, len(committed), len(jobs), len(committed), force=True)
        published: set[int] = set()
        try:
            with closing(self.executor.run(fn, [job for _, job in todo])) as results:
                for index, result in results:
                    key, job = todo[index]
                    result = publish_staged(self.store, result)
                    published.add(index)
                    self.guard.produced(result.outputs.values())
                    crash_point(f"{stage}.before_commit")
                    committed[key] = records.write_task_record(self.store, stage, key, result.outputs, result.summary)
                    if result.log:
                        self.log["tasks"].setdefault(stage, {})[key] = result.log
                    run.ran += 1
                    done_bytes += nbytes(job)
                    self.progress.tick(stage, len(committed), len(jobs), run.cached, done_bytes)
        except BaseException:
            for index, (_, job) in enumerate(todo):
                if index not in published:
                    discard_staged(self.store, job)
            raise
        return committed

    def committed_stages(self) -> list[StageRun]:
        """The stages that committed a manifest, which the snapshot lists (merge commits none)."""
        return [run for run in self.stages.values() if run.output]

    def stage_key(self, stage: str, settings: dict[str, Any], inputs: Any) -> str:
        key = records.content_key(stage, settings, self.code, inputs)
        self.stages.setdefault(stage, StageRun(stage)).key = key
        return key

    def read_stage(self, stage: str, key: str) -> dict[str, Any] | None:
        """The committed stage manifest, or None when the stage is not committed or its manifest
        object is corrupt or missing (then the stage is rebuilt from its task records). An unreadable
        stage record, or one naming anything but that stage's manifest, is an IntegrityError:
        create-only, it cannot be replaced by a rebuilt one."""
        record = records.read_stage_record(self.store, stage, key)
        if record is None:
            return None
        try:
            raw = cas.get_bytes(self.store, record.output)
        except (IntegrityError, NotFoundError) as exc:
            self.progress.info(f"warning: the {stage} stage manifest is unusable ({exc}); rebuilding it from its tasks")
            self.guard.recomputed.append({"object": record.output, "what": f"{stage} stage manifest"})
            return None
        return records.stage_manifest(self.store, record, raw)

    def commit_stage(self, stage: str, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
        existing = self.read_stage(stage, key)
        if existing is None:
            # Storing the manifest replaces a corrupt stored copy (prep.store.cas checks what it finds).
            records.commit_stage(self.store, stage, key, manifest)
            existing = records.read_stage(self.store, stage, key)
        assert existing is not None
        self.stages[stage].output = records.stage_output_id(self.store, stage, key)
        return existing

    # -- stages -----------------------------------------------------------------------------
    def tokenize(self, sources: list[SourceFile], settings: TokenizeSettings) -> list[dict[str, Any]]:
        tasks: list[ReadTask] = []
        for source in sources:
            tasks.extend(plan_read_tasks(source, self.pipeline.input.text_field, self.pipeline.input.id_field,
                                         self.pipeline.input.max_document_bytes))
        # Where workers share this machine's store, the driver stores intermediates (and waits
        # for their fsync) while the workers go on tokenizing.
        driver_stores = self.executor.shares_filesystem and self.store.local_path("objects") is not None
        jobs = []
        for task in tasks:
            key = records.content_key("tokenize", settings.key_fields(), self.code, *task.key_parts())
            jobs.append((key, TokenizeJob(self.store.url, task, settings, driver_stores)))
        total_bytes = sum(source.size for source in sources)
        self.progress.stage("tokenize", f"{plural(len(jobs), 'task')} over {plural(len(sources), 'file')}, "
                                        f"{human_bytes(total_bytes)}")
        done = self.run_tasks("tokenize", jobs, run_tokenize_job, task_bytes,
                              lambda job: f"tokenize output of {job.task.source.rel} part {job.task.part}")
        entries: list[dict[str, Any]] = []
        line_offsets: dict[str, int] = {}
        for (key, job) in jobs:
            record = done[key]
            summary = record.summary
            offset = line_offsets.get(job.task.source.rel, 0)
            line_offsets[job.task.source.rel] = offset + int(summary.get("lines", 0))
            entries.append({**job.task.describe(), "key": key, "output": record.outputs["intermediate"],
                            "entries": _part_entries(self.store, record), "line_offset": offset,
                            **{k: v for k, v in summary.items()}})
        stage_key = self.stage_key("tokenize", settings.key_fields(), [key for key, _ in jobs])
        manifest = self.commit_stage("tokenize", stage_key, {"tasks": entries})
        reloads = sum(int(log.get("engine_reloads", 0)) for log in self.log["tasks"].get("tokenize", {}).values())
        self.progress.done("tokenize", stage_counts(self.stages['tokenize'])
                           + (f", tokenizer reloaded {plural(reloads, 'time')} ([build] tokenizer_cache)" if reloads else ""))
        return list(manifest["tasks"])

    def parts(self, entries: list[dict[str, Any]]) -> tuple[PartRef, ...]:
        return tuple(PartRef(e["output"], e["source"], e["format"], e["line_offset"], e["documents"], e["entries"])
                     for e in entries)


def _part_entries(store: Store, record: records.TaskRecord) -> str:
    """The part's entries object a tokenize task record names; IntegrityError for a record without
    one (valid for a build before layout 3, never under a key of this code), which no rerun replaces."""
    if "entries" not in record.outputs:
        raise IntegrityError(f"{store.url}/{task_record_key('tokenize', record.key)}: the task record names no part's "
                             "entries (a record of an earlier layout under this build's key); remove it and rebuild")
    return record.outputs["entries"]


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


def _build(pipeline: Pipeline, store: Store, executor: Executor, progress: Progress, lease: Lease,
           publishing: Publishing) -> BuildResult:
    builder = Builder(pipeline, store, executor, progress, publishing.options.readback)
    started = time.time()
    tokenizer_path = pipeline.tokenizer_path()
    info = describe_tokenizer(tokenizer_path, pipeline.tokenizer.eos, pipeline.tokenizer.encode_special_tokens)

    progress.stage("inputs", "discovering and hashing")
    discovered = discover(pipeline.input.paths, pipeline.base_dir, pipeline.input.format)
    latest = unchanged_latest(store, pipeline, discovered, builder.code, info.sha256)
    publishing.plan.check_expect(latest is not None)
    if latest is None:
        executor.warm(WarmUp(str(tokenizer_path), info.sha256, pipeline.tokenizer.eos,
                             pipeline.tokenizer.encode_special_tokens, pipeline.tokenizer.backend))
    sources = hash_inputs_meanwhile(discovered, executor, _precheck(builder, latest))
    version = input_version(sources)
    progress.done("inputs", f"{plural(len(sources), 'file')}, {human_bytes(sum(s.size for s in sources))}, {version[:19]}")

    settings = builder.tokenize_settings = tokenize_settings(pipeline, str(tokenizer_path), info.sha256)
    try:
        entries = builder.tokenize(sources, settings)
    finally:
        release_spool(sources)  # S3 inputs were read once, into the spool; no later stage reads them
    if sum(int(e["documents"]) for e in entries) == 0:
        dropped = sum(int(step["dropped"]) for step in step_stats(entries))
        by_steps = f" left by [[steps]] (they dropped all {dropped} read)" if dropped else ""
        raise InputError(f"{pipeline.source}: the corpus has no documents{by_steps} in {len(sources)} input "
                         f"file{'s' if len(sources) != 1 else ''}: {describe_inputs(sources)}")
    shards, duplicates = _global_stages(builder, entries, info.dtype, info.eos_id)
    manifest = snapshot_manifest(
        dataset=pipeline.dataset, seed=pipeline.seed, version=version, sources=sources, code=builder.code,
        tokenizer=info.to_json(), config=pipeline.resolved(), stages=builder.committed_stages(), shards=shards,
        formats=pipeline.output.formats, stats=build_stats(entries, duplicates, shards))
    if lease.lapsed:
        raise StoreError(f"{store.url}: this build's lease lapsed (the store was unreachable too long); "
                         "rerun to publish from the committed work")
    snapshot = snapshots.publish_manifest(store, manifest)
    crash_point("publish.before_refs")
    readback, outcomes = _publish(builder, snapshot, publishing)
    extra = {"tasks": builder.log["tasks"], **({"recomputed": builder.guard.recomputed} if builder.guard.recomputed else {})}
    facts = BuildFacts(started, publishing.backend, executor.workers, readback.to_json(), outcomes)
    try:
        log_key = write_log(store, pipeline.dataset, snapshot, builder.stages, sources, entries, facts, extra)
    except StoreError as exc:  # the refs moved already: the build did publish, only its log is lost
        progress.info(f"warning: the build log could not be stored ({exc}); the snapshot is published")
        log_key = ""
    return BuildResult(snapshot, outcomes, builder.stages, log_key, readback)


def _precheck(builder: Builder, latest: Snapshot | None) -> Callable[[], object] | None:
    """For a rebuild that looks unchanged, on a pool sharing this machine (the driver's threads
    hash the inputs meanwhile): re-hash the latest snapshot's artifacts on the workers now, so
    that when the shard stage reuses them they are trusted instead of checked after everything."""
    if latest is None or not builder.executor.shares_filesystem:
        return None
    object_ids = sorted({f"sha256:{artifact['sha256']}" for artifact in latest.artifacts})
    return lambda: builder.guard.find_bad(object_ids)


def _publish(builder: Builder, snapshot: Snapshot, publishing: Publishing) -> tuple[Readback, list[RefOutcome]]:
    """Read the snapshot back (unless told not to, or no ref would move), then move the refs."""
    store, progress, plan = builder.store, builder.progress, publishing.plan
    pending = plan.pending(store, snapshot.id)
    readback = Readback(False, skipped="no ref moves" if not pending else "--no-readback")
    if pending and publishing.options.readback:
        # What this build stored or recomputed is read back even if a record says it passed (gc
        # may have collected the object since, and this build stored it again).
        rewritten = builder.guard.stored | {str(item["object"]) for item in builder.guard.recomputed}
        readback = read_back(store, snapshot, executor_checker(store, builder.executor),
                             passed_before(store, plan.latest_snapshot), rewritten, builder.guard.read_back)
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


def _global_stages(builder: Builder, entries: list[dict[str, Any]], dtype: str,
                   eos_id: int) -> tuple[list[dict[str, Any]], int]:
    """Order and shard over the tokenize outputs; returns the shards and duplicates dropped."""
    parts = builder.parts(entries)
    ordered = ordering.order(builder, parts, 2 if dtype == "uint16" else 4, dtype)
    shards = ordering.shard(builder, parts, ordered, dtype, eos_id)
    return shards, sum(int(bucket["duplicates_dropped"]) for bucket in ordered["buckets"])
