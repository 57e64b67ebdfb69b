"""The near-duplicate cluster stage (issue 42): one task joins every bucket's pairs into clusters
and stores the drops object, every document but its cluster's first with that first, indexed by
order key so each order task reads its own bucket's drops. Its memory is O(documents some pair
names), never O(corpus) (prep/stages/neardedup.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prep.errors import IntegrityError
from prep.hashing import pack_ids, unpack_ids
from prep.neardup.sizes import ClusterSizes
from prep.progress import plural
from prep.runner.nearbuckets import Paired
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, store_written, stored_table, worker_store
from prep.runner.tokenizing import Tokenized
from prep.store.layout import task_record_key
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord


@dataclass(frozen=True)
class ClusterJob:
    """Join the clusters of every bucket's pairs object (`table` packs their ids, in bucket order)."""

    store_url: str
    table: str


def run_cluster_job(job: ClusterJob) -> TaskResult:
    from prep.neardup.sizes import cluster_sizes
    from prep.stages.neardedup import cluster_drops
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.drops import write_drops
    from prep.workfiles.pairs import read_pairs

    drop_engines()
    store = worker_store(job.store_url)
    ids = unpack_ids(stored_table(store, job.table))

    def write(staged: Any) -> Any:
        records = cluster_drops(read_pairs(fetch_local(store, object_id)) for object_id in ids)
        sizes = cluster_sizes(records["representative"])
        return write_drops(staged, records, {}), {"dropped": len(records), "clusters": sizes.clusters,
                                                  **sizes.to_json()}

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
        table = pack_ids(previous.pairs)
        table_id = context.table_id(table)
        settings = previous.settings.key_fields()
        key = context.task_key(self.name, settings, [table_id])
        task = Task(key, ClusterJob(context.store_url, table_id), "drops of the near-duplicate clusters",
                    reads=(*previous.pairs, table_id))
        return StagePlan(TaskPlan(self.name, (task,), run_cluster_job, found=context.committed(self.name, [key]),
                                  reads=lambda missing: [list(task.reads)], tables={table_id: table}),
                         settings, [table_id], f"clusters of {plural(len(previous.pairs), 'pairs object')}")

    def result(self, previous: Paired, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Clustered:
        task = plan.tasks.tasks[0]
        record = committed[task.key]
        counts = NearCounts(sum(previous.counts), previous.pairs_rejected, int(record.summary["dropped"]),
                            _recorded_sizes(task.job.store_url, record))
        return Clustered(previous.tokenized, record.outputs["drops"], counts)

    def done(self, result: Clustered, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        counts = result.counts
        return (f"{plural(counts.dropped, 'near duplicate')} in {plural(counts.sizes.clusters, 'cluster')} "
                f"(largest {counts.sizes.largest}), " + stage_counts(run))


def _recorded_sizes(store_url: str, record: TaskRecord) -> ClusterSizes:
    """The cluster sizes a committed cluster task recorded; IntegrityError when they are not log2
    bins up to the largest size's or do not add up to its clusters (the schema cannot say either)."""
    where = f"{store_url}/{task_record_key('near_clusters', record.key)}"
    try:
        sizes = ClusterSizes.from_json(record.summary)
    except ValueError as exc:
        raise IntegrityError(f"{where}: {exc}; remove it and rebuild") from None
    if sizes.clusters != int(record.summary["clusters"]):
        raise IntegrityError(f"{where}: its cluster size bins do not add up to its clusters; remove it and rebuild")
    return sizes
