"""The near-duplicate cluster stage (issue 42): one task joins every bucket's pairs into clusters
and stores the drops object, every document but its cluster's first with that first, indexed by
order key so each order task reads its own bucket's drops. Its memory is O(documents some pair
names), never O(corpus) (prep/stages/neardedup.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prep.hashing import pack_ids, unpack_ids
from prep.progress import plural
from prep.runner.nearbuckets import Paired
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, store_written, stored_table, worker_store
from prep.runner.tokenizing import Tokenized
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord


@dataclass(frozen=True)
class ClusterJob:
    """Join the clusters of every bucket's pairs object (`table` packs their ids, in bucket order)."""

    store_url: str
    table: str


def run_cluster_job(job: ClusterJob) -> TaskResult:
    from prep.stages.neardedup import cluster_drops
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.drops import write_drops
    from prep.workfiles.pairs import read_pairs

    drop_engines()
    store = worker_store(job.store_url)
    ids = unpack_ids(stored_table(store, job.table))

    def write(staged: Any) -> Any:
        records = cluster_drops(read_pairs(fetch_local(store, object_id)) for object_id in ids)
        representatives = records["representative"]
        clusters = len(set(representatives.tolist()))
        return write_drops(staged, records, {}), {"dropped": len(records), "clusters": clusters}

    stored, summary = store_written(store, "near_clusters", write)
    return TaskResult({"drops": stored}, summary, {})


@dataclass(frozen=True)
class Clustered:
    """The cluster stage's result: the parts, the drops object and its counts."""

    tokenized: Tokenized
    drops: str
    dropped: int
    clusters: int

    def manifest(self) -> dict[str, object]:
        return {"drops": self.drops, "dropped": self.dropped, "clusters": self.clusters}


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
        record = committed[plan.tasks.tasks[0].key]
        return Clustered(previous.tokenized, record.outputs["drops"], int(record.summary["dropped"]),
                         int(record.summary["clusters"]))

    def done(self, result: Clustered, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return (f"{plural(result.dropped, 'near duplicate')} in {plural(result.clusters, 'cluster')}, "
                + stage_counts(run))
