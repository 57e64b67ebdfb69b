"""The near-duplicate cluster stage (issue 42): the cluster rounds over document ranges
(prep/runner/nearrounds.py) join every bucket's pairs into clusters, then one task merges the
ranges' drops into the drops object, every document but its cluster's first with that first,
indexed by order key so each order task reads its own bucket's drops. No task holds more than its
range's edges, and the merge streams (prep.workfiles.indexed.merge_indexed).

The task's key, and the stage's, name the bucket stage's pairs, not the ranges: the drops object
is the same bytes however many ranges the rounds used, and so is the stage manifest and the
snapshot. So a build finds the task committed before any round runs, and runs none: after gc
has collected the round tasks' records, rounds are not run again for a drops object already
made (a drops object found bad is made again by the task alone, every round in one process)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prep.hashing import Digest, pack_ids
from prep.neardup.sizes import ClusterSizes
from prep.progress import plural
from prep.runner.nearbuckets import Paired
from prep.runner.nearrounds import cluster_ranges, range_bits, recorded_sizes, table_files
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, store_written, worker_store
from prep.runner.tokenizing import Tokenized
from prep.storage.backend import Store
from prep.store.records import TaskRecord


@dataclass(frozen=True)
class ClusterJob:
    """Make the drops object: merge every range's drops object (`ranges` packs their ids, in
    range order; the ranges' `sizes` are recorded with it); or, without `ranges`, run every round
    in this one task over the pairs objects `pairs` packs, in `2**bits` ranges, a range at a time:
    how the drops object of a task found committed is made again once the round tasks' records
    and objects are collected (the same bytes, in one task's time)."""

    store_url: str
    pairs: str
    bits: int
    ranges: str | None = None
    sizes: ClusterSizes | None = None


def run_cluster_job(job: ClusterJob) -> TaskResult:
    from prep.stages.tokenize import drop_engines

    drop_engines()
    store = worker_store(job.store_url)
    write = _merged(store, job) if job.ranges is not None else _remade(store, job)
    stored, summary = store_written(store, "near_clusters", write)
    return TaskResult({"drops": stored}, summary, {})


Written = Callable[[Path], tuple[Digest, dict[str, Any]]]


def _merged(store: Store, job: ClusterJob) -> Written:
    """The drops object merged from the ranges' and its summary, with the ranges' sizes."""
    from prep.workfiles.drops import merge_drops, open_drops

    sources = table_files(store, str(job.ranges))
    sizes = job.sizes or ClusterSizes((), 0)

    def write(staged: Path) -> tuple[Digest, dict[str, Any]]:
        digest = merge_drops(staged, sources)
        return digest, _summary(int(open_drops(staged).header["count"]), sizes)

    return write


def _remade(store: Store, job: ClusterJob) -> Written:
    """The drops object made again from the pairs objects by every round in this task."""
    from prep.neardup.sizes import sizes_of
    from prep.stages.starrounds import drops_in_one_process
    from prep.workfiles.drops import open_drops

    pairs = table_files(store, job.pairs)

    def write(staged: Path) -> tuple[Digest, dict[str, Any]]:
        work = staged.with_name(staged.name + ".rounds")
        try:
            digest, star_sizes = drops_in_one_process(pairs, work, job.bits, staged)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return digest, _summary(int(open_drops(staged).header["count"]), sizes_of(star_sizes))

    return write


def _summary(dropped: int, sizes: ClusterSizes) -> dict[str, Any]:
    return {"dropped": dropped, "clusters": sizes.clusters, **sizes.to_json()}


@dataclass(frozen=True)
class NearCounts:
    """What near-duplicate removal counted before the order stage: the candidate pairs the bucket
    tasks stored (a pair once per bucket it is found in) and, with `verify`, the comparisons it
    rejected; the documents the clusters drop (every member but the first, exact copies included)
    and the clusters' size distribution. A snapshot's `stats.near_clusters`."""

    pairs: int
    pairs_rejected: int | None
    dropped: int
    sizes: ClusterSizes

    def to_json(self) -> dict[str, object]:
        rejected = {} if self.pairs_rejected is None else {"pairs_rejected": self.pairs_rejected}
        return {"pairs": self.pairs, **rejected, "clusters": self.sizes.clusters, "dropped": self.dropped,
                **self.sizes.to_json()}


@dataclass(frozen=True)
class Clustered:
    """The cluster stage's result: the parts, the drops object and its counts."""

    tokenized: Tokenized
    drops: str
    counts: NearCounts

    def manifest(self) -> dict[str, object]:
        return {"drops": self.drops, "dropped": self.counts.dropped, "clusters": self.counts.sizes.clusters,
                **self.counts.sizes.to_json()}


@dataclass(frozen=True)
class NearClusters:
    """The cluster stage of near-duplicate removal."""

    name: str = "near_clusters"

    def plan(self, previous: Paired, context: StageContext) -> StagePlan:
        pairs = pack_ids(previous.pairs)
        pairs_id = context.table_id(pairs)
        settings = previous.settings.key_fields()
        key = context.task_key(self.name, settings, [pairs_id])
        found = context.committed(self.name, [key])
        tables = {pairs_id: pairs}
        if found[key] is not None:  # no rounds: a drops object found bad is made again in one task
            job = ClusterJob(context.store_url, pairs_id, range_bits(previous))
            reads, describe = (*previous.pairs, pairs_id), "the drops object, committed"
        else:
            ranges = cluster_ranges(context, previous)
            ranges_id = context.table_id(pack_ids(ranges.drops))
            tables[ranges_id] = pack_ids(ranges.drops)
            job = ClusterJob(context.store_url, pairs_id, range_bits(previous), ranges_id, ranges.sizes)
            reads, describe = (*ranges.drops, ranges_id), f"drops of {plural(len(ranges.drops), 'range')} merged"
        task = Task(key, job, "drops of the near-duplicate clusters", reads=reads)
        return StagePlan(TaskPlan(self.name, (task,), run_cluster_job, found=found,
                                  reads=lambda missing: [list(task.reads)], tables=tables),
                         settings, [pairs_id], describe)

    def result(self, previous: Paired, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Clustered:
        task = plan.tasks.tasks[0]
        record = committed[task.key]
        counts = NearCounts(sum(previous.counts), previous.pairs_rejected, int(record.summary["dropped"]),
                            recorded_sizes(task.job.store_url, record))
        return Clustered(previous.tokenized, record.outputs["drops"], counts)

    def done(self, result: Clustered, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        counts = result.counts
        return (f"{plural(counts.dropped, 'near duplicate')} in {plural(counts.sizes.clusters, 'cluster')} "
                f"(largest {counts.sizes.largest}), " + stage_counts(run))
