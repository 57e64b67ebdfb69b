"""The near-duplicate cluster stage (issue 42): the cluster rounds over document ranges
(prep/runner/nearrounds.py) join every bucket's pairs into clusters, then one task merges the
ranges' drops into the drops object, every document but its cluster's first with that first,
indexed by order key so each order task reads its own bucket's drops. No task holds more than its
range's edges, and the merge streams (prep.workfiles.indexed.merge_indexed).

The stage's key names the bucket stage's pairs, not the ranges: the drops object is the same
bytes however many ranges the rounds used, and so is the stage manifest and the snapshot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prep.hashing import pack_ids, unpack_ids
from prep.neardup.sizes import ClusterSizes
from prep.progress import plural
from prep.runner.nearbuckets import Paired
from prep.runner.nearrounds import cluster_ranges, recorded_sizes
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, store_written, stored_table, worker_store
from prep.runner.tokenizing import Tokenized
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord


@dataclass(frozen=True)
class ClusterJob:
    """Merge every range's drops object (`table` packs their ids, in range order) into one; the
    ranges' `sizes` are recorded with it."""

    store_url: str
    table: str
    sizes: ClusterSizes


def run_cluster_job(job: ClusterJob) -> TaskResult:
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.drops import merge_drops, open_drops

    drop_engines()
    store = worker_store(job.store_url)
    sources = [fetch_local(store, object_id) for object_id in unpack_ids(stored_table(store, job.table))]

    def write(staged: Any) -> Any:
        digest = merge_drops(staged, sources)
        dropped = int(open_drops(staged).header["count"])
        return digest, {"dropped": dropped, "clusters": job.sizes.clusters, **job.sizes.to_json()}

    stored, summary = store_written(store, "near_clusters", write)
    return TaskResult({"drops": stored}, summary, {})


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
        ranges = cluster_ranges(context, previous)
        table = pack_ids(ranges.drops)
        table_id = context.table_id(table)
        settings = previous.settings.key_fields()
        key = context.task_key(self.name, settings, [table_id])
        task = Task(key, ClusterJob(context.store_url, table_id, ranges.sizes), "drops of the near-duplicate clusters",
                    reads=(*ranges.drops, table_id))
        return StagePlan(TaskPlan(self.name, (task,), run_cluster_job, found=context.committed(self.name, [key]),
                                  reads=lambda missing: [list(task.reads)], tables={table_id: table}),
                         settings, [context.table_id(pack_ids(previous.pairs))],
                         f"drops of {plural(len(ranges.drops), 'range')} merged")

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
