"""The near-duplicate cluster rounds (issue 42), nested in the cluster stage as the merge level is
in the order stage: route every bucket's pairs to document ranges, alternate large-star and
small-star rounds over the ranges until every range's edges are stars, then write each range's
drops (prep/neardup/stars.py, prep/stages/starrounds.py).

A task holds its range's edges, never the graph's: ranges are `2**bits` slices of the routing
hash, as many as the candidate pairs ask (`EDGES_PER_RANGE`), so the data decides them, never the
workers. The rounds end in the same stars whatever the ranges, and the cluster stage merges the
ranges' drops into one object, the same bytes for any split. Like merge tasks, round tasks keep
task records (a rerun after a crash redoes only uncommitted ones) that no snapshot names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prep.errors import IntegrityError
from prep.hashing import pack_ids, unpack_ids
from prep.neardup.settings import MAX_ROUNDS
from prep.neardup.sizes import ClusterSizes, total_sizes
from prep.progress import plural
from prep.runner.nearbuckets import Paired
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, store_written, stored_table, worker_store
from prep.stages.cuts import bucket_bits
from prep.storage.backend import Store
from prep.store.layout import task_record_key
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord

if TYPE_CHECKING:
    import numpy as np

    from prep.workfiles.indexed import RecordFormat

EDGES_PER_RANGE = 1 << 22
"""Target edge records a range task holds (24 bytes each, a few times that while sorting): about
0.4 GB at most. An edge is held twice in large-star rounds, so a build of P candidate pairs has
about 2P / EDGES_PER_RANGE ranges."""
LAYOUT = {"edges": "prep.edges/1", "nodes": "prep.nodes/1"}  # what round keys name besides their inputs


@dataclass(frozen=True)
class EdgeLevel:
    """What one round left: its edges objects (the route stage's first), the nodes objects, the
    range bits, and (after a large-star round) whether every range's edges were stars already."""

    edges: tuple[str, ...]
    nodes: tuple[str, ...]
    bits: int
    settled: bool = False

    def manifest(self) -> None:
        return None


@dataclass(frozen=True)
class RangeDrops:
    """Every range's drops object, the documents they drop and the sizes of their clusters."""

    drops: tuple[str, ...]
    dropped: int
    sizes: ClusterSizes

    def manifest(self) -> None:
        return None


@dataclass(frozen=True)
class RouteJob:
    """Route one bucket's pairs object to ranges: its edges, held both ways, and its documents' nodes."""

    store_url: str
    pairs: str


@dataclass(frozen=True)
class RoundJob:
    """One round over range `bucket` of `2**bits` of the edges objects `table` packs."""

    store_url: str
    table: str
    bucket: int
    bits: int
    large: bool


@dataclass(frozen=True)
class RangeDropsJob:
    """The drops of finished range `bucket` of `2**bits`: `edges` and `nodes` pack the objects' ids."""

    store_url: str
    edges: str
    nodes: str
    bucket: int
    bits: int


def run_route_job(job: RouteJob) -> TaskResult:
    from prep.stages.starrounds import routed_pairs
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.edges import write_edges, write_nodes
    from prep.workfiles.pairs import read_pairs

    drop_engines()
    store = worker_store(job.store_url)
    edges, nodes = routed_pairs(read_pairs(fetch_local(store, job.pairs)))
    edges_id, _ = store_written(store, "near_route", lambda staged: (write_edges(staged, edges, {}), {}))
    nodes_id, _ = store_written(store, "near_route", lambda staged: (write_nodes(staged, nodes, {}), {}))
    return TaskResult({"edges": edges_id, "nodes": nodes_id}, {"edges": len(edges), "documents": len(nodes)}, {})


def run_round_job(job: RoundJob) -> TaskResult:
    from prep.stages.starrounds import star_round
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.edges import EDGES, read_range, write_edges

    drop_engines()
    store = worker_store(job.store_url)
    held = read_range(table_files(store, job.table), EDGES, job.bucket, job.bits)
    edges, settled = star_round(held, job.large)
    stored, _ = store_written(store, "near_round", lambda staged: (write_edges(staged, edges, {}), {}))
    return TaskResult({"edges": stored}, {"held": len(held), "edges": len(edges), "large": job.large,
                                          **({"settled": settled} if job.large else {})}, {})


def run_range_drops_job(job: RangeDropsJob) -> TaskResult:
    from prep.neardup.sizes import sizes_of
    from prep.stages.starrounds import range_drops
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.drops import write_drops
    from prep.workfiles.edges import EDGES, NODES, read_range

    drop_engines()
    store = worker_store(job.store_url)

    def read(table: str, form: RecordFormat) -> np.ndarray:
        return read_range(table_files(store, table), form, job.bucket, job.bits)

    records, sizes = range_drops(read(job.edges, EDGES), read(job.nodes, NODES))
    stored, _ = store_written(store, "near_drops", lambda staged: (write_drops(staged, records, {}), {}))
    return TaskResult({"drops": stored}, {"dropped": len(records), "clusters": len(sizes), **sizes_of(sizes).to_json()},
                      {})


def table_files(store: Store, table: str) -> list[Path]:
    """The checked local copies of the objects a packed id table (`TaskPlan.tables`) names, in its order."""
    return [fetch_local(store, object_id) for object_id in unpack_ids(stored_table(store, table))]


def range_bits(paired: Paired) -> int:
    """The bits of the ranges the rounds split the bucket stage's candidate pairs into (each held twice)."""
    return bucket_bits(2 * sum(paired.counts), EDGES_PER_RANGE)


def cluster_ranges(context: StageContext, paired: Paired) -> RangeDrops:
    """Every range's drops: the pairs routed, then large-star and small-star rounds until every
    range's edges are stars, each round's tasks run (or found committed) before the next is planned."""
    level = context.run_stage(Routing(), paired)
    for round in range(1, MAX_ROUNDS + 1):
        after = context.run_stage(StarRound(True, round), level)
        if after.settled:
            return context.run_stage(RangeDropping(), level)
        level = context.run_stage(StarRound(False, round), after)
    raise IntegrityError(f"near-duplicate clusters did not settle in {MAX_ROUNDS} rounds: a damaged edges object")


@dataclass(frozen=True)
class Routing:
    """Route each bucket's pairs object to ranges, as many as its candidate pairs ask."""

    name: str = "near_route"

    def plan(self, previous: Paired, context: StageContext) -> StagePlan:
        keys = [context.task_key(self.name, LAYOUT, [pairs]) for pairs in previous.pairs]
        tasks = tuple(Task(key, RouteJob(context.store_url, pairs), f"edges of pairs object {pairs[:19]}",
                           reads=(pairs,)) for key, pairs in zip(keys, previous.pairs))
        return StagePlan(TaskPlan(self.name, tasks, run_route_job, found=context.committed(self.name, keys),
                                  reads=_reads), LAYOUT, keys, f"{plural(len(tasks), 'pairs object')} to route")

    def result(self, previous: Paired, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> EdgeLevel:
        records = [committed[task.key] for task in plan.tasks.tasks]
        return EdgeLevel(tuple(record.outputs["edges"] for record in records),
                         tuple(record.outputs["nodes"] for record in records), range_bits(previous))

    def done(self, result: EdgeLevel, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{plural(1 << result.bits, 'range')}, " + stage_counts(run)


@dataclass(frozen=True)
class StarRound:
    """One large-star or small-star round over every range."""

    large: bool
    round: int
    name: str = "near_round"

    def plan(self, previous: EdgeLevel, context: StageContext) -> StagePlan:
        table = pack_ids(previous.edges)
        table_id = context.table_id(table)
        settings = {**LAYOUT, "bits": previous.bits, "large": self.large}
        keys = [context.task_key(self.name, settings, [table_id, bucket]) for bucket in range(1 << previous.bits)]
        tasks = tuple(Task(key, RoundJob(context.store_url, table_id, bucket, previous.bits, self.large),
                           f"{self._kind} round {self.round} of range {bucket}", reads=(table_id, *previous.edges))
                      for bucket, key in enumerate(keys))
        return StagePlan(TaskPlan(self.name, tasks, run_round_job, found=context.committed(self.name, keys),
                                  reads=_reads, tables={table_id: table}),
                         settings, [table_id], f"{self._kind} round {self.round} over {plural(len(tasks), 'range')}")

    @property
    def _kind(self) -> str:
        return "large-star" if self.large else "small-star"

    def result(self, previous: EdgeLevel, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> EdgeLevel:
        records = [committed[task.key] for task in plan.tasks.tasks]
        settled = self.large and all(_settled(plan.tasks.tasks[0].job.store_url, record) for record in records)
        return EdgeLevel(tuple(record.outputs["edges"] for record in records), previous.nodes, previous.bits, settled)

    def done(self, result: EdgeLevel, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{self._kind} round {self.round}{' (settled)' if result.settled else ''}: " + stage_counts(run)


@dataclass(frozen=True)
class RangeDropping:
    """Each finished range's drops object."""

    name: str = "near_drops"

    def plan(self, previous: EdgeLevel, context: StageContext) -> StagePlan:
        edges, nodes = pack_ids(previous.edges), pack_ids(previous.nodes)
        edges_id, nodes_id = context.table_id(edges), context.table_id(nodes)
        settings = {**LAYOUT, "bits": previous.bits}
        keys = [context.task_key(self.name, settings, [edges_id, nodes_id, bucket])
                for bucket in range(1 << previous.bits)]
        tasks = tuple(Task(key, RangeDropsJob(context.store_url, edges_id, nodes_id, bucket, previous.bits),
                           f"drops of range {bucket}", reads=(edges_id, nodes_id, *previous.edges, *previous.nodes))
                      for bucket, key in enumerate(keys))
        return StagePlan(TaskPlan(self.name, tasks, run_range_drops_job, found=context.committed(self.name, keys),
                                  reads=_reads, tables={edges_id: edges, nodes_id: nodes}),
                         settings, [edges_id, nodes_id], f"drops of {plural(len(tasks), 'range')}")

    def result(self, previous: EdgeLevel, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> RangeDrops:
        records = [committed[task.key] for task in plan.tasks.tasks]
        store_url = plan.tasks.tasks[0].job.store_url
        return RangeDrops(tuple(record.outputs["drops"] for record in records),
                          sum(int(record.summary["dropped"]) for record in records),
                          total_sizes([recorded_sizes(store_url, record) for record in records]))

    def done(self, result: RangeDrops, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{plural(result.dropped, 'near duplicate')} in {plural(len(result.drops), 'range')}, " + stage_counts(run)


def _reads(missing: Sequence[Task[object]]) -> list[list[str]]:
    """What the missing round tasks read, checked in one group before any runs."""
    return [sorted({object_id for task in missing for object_id in task.reads})]


def _settled(store_url: str, record: TaskRecord) -> bool:
    """Whether a large-star task found its range's edges were stars; IntegrityError when its
    record does not say (the schema requires it of a record that says it is a large-star round's)."""
    settled = record.summary.get("settled")
    if record.summary.get("large") is not True or not isinstance(settled, bool):
        raise IntegrityError(f"{store_url}/{task_record_key(record.stage, record.key)}: a large-star round's record "
                             "does not say whether its range settled; remove it and rebuild")
    return settled


def recorded_sizes(store_url: str, record: TaskRecord) -> ClusterSizes:
    """The cluster sizes a committed task recorded; IntegrityError when they are not log2 bins up
    to the largest size's or do not add up to its clusters (the schema cannot say either)."""
    where = f"{store_url}/{task_record_key(record.stage, record.key)}"
    try:
        sizes = ClusterSizes.from_json(record.summary)
    except ValueError as exc:
        raise IntegrityError(f"{where}: {exc}; remove it and rebuild") from None
    if sizes.clusters != int(record.summary["clusters"]):
        raise IntegrityError(f"{where}: its cluster size bins do not add up to its clusters; remove it and rebuild")
    return sizes
