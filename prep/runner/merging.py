"""The merge level between tokenize and order: with more parts than `[build] merge_fan_in`, merge
tasks merge groups of consecutive parts' entries into runs, round after round, until at most
that many are left, so an order task reads at most `merge_fan_in` entries objects however many
parts the corpus has (docs/build.md, "merge").

Merging changes no output: an order task's key does not name what it read, and its bucket is
the same from runs as from parts. The runs are not part of the snapshot either: merge tasks
keep task records (a rerun after a crash redoes only uncommitted merges), which no snapshot
names, so gc collects them and their runs once past the grace period.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prep.progress import plural
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan
from prep.runner.tasks import TaskResult, store_written, worker_store
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord

ENTRIES_LAYOUT = {"entries": "prep.entries/1"}  # what a merge task's key names besides its inputs


@dataclass(frozen=True)
class Source:
    """An entries object the order stage reads: a part's or a run's, with the ordinal of its
    first part and how many documents it holds."""

    object_id: str
    first_part: int
    documents: int


@dataclass(frozen=True)
class Level:
    """The entries objects one merge round leaves (the parts' own before the first)."""

    sources: tuple[Source, ...]

    def manifest(self) -> None:
        return None


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
    stored, summary = store_written(store, "merge", lambda staged: merge_runs(inputs, staged))
    return TaskResult({"run": stored}, summary, {})


@dataclass(frozen=True)
class MergeRound:
    """One merge round: groups of at most `fan_in` consecutive sources, each merged into a run
    (a group of one passes through)."""

    fan_in: int
    round: int
    name: str = "merge"

    def plan(self, previous: Level, context: StageContext) -> StagePlan:
        tasks = []
        for first, end in merge_groups(len(previous.sources), self.fan_in):
            group = previous.sources[first:end]
            if len(group) > 1:
                inputs = tuple((source.object_id, source.first_part - group[0].first_part) for source in group)
                key = context.task_key("merge", ENTRIES_LAYOUT, [list(item) for item in inputs])
                job = MergeJob(context.store_url, inputs, sum(source.documents for source in group))
                tasks.append(Task(key, job, f"merge of {plural(len(inputs), 'entries object')}", job.documents,
                                  reads=tuple(object_id for object_id, _ in inputs)))
        groups = len(merge_groups(len(previous.sources), self.fan_in))
        return StagePlan(TaskPlan("merge", tuple(tasks), run_merge_job, reads=_reads), {"fan_in": self.fan_in},
                         [task.key for task in tasks],
                         f"round {self.round}: {plural(len(previous.sources), 'entries object')} into "
                         f"{plural(groups, 'run')}")

    def result(self, previous: Level, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Level:
        merged = iter(plan.tasks.tasks)
        level = []
        for first, end in merge_groups(len(previous.sources), self.fan_in):
            group = previous.sources[first:end]
            if len(group) == 1:
                level.append(group[0])
                continue
            task = next(merged)
            level.append(Source(committed[task.key].outputs["run"], group[0].first_part, task.job.documents))
        return Level(tuple(level))

    def done(self, result: Level, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"round {self.round}: {plural(run.ran, 'task')} run, {run.cached} cached"


def _reads(missing: Sequence[Task[MergeJob]]) -> list[list[str]]:
    """What the missing merge tasks read, checked in one group before any runs."""
    return [[object_id for task in missing for object_id in task.reads]]


def merged_sources(context: StageContext, parts: Level, fan_in: int) -> Level:
    """The parts' entries objects, merged in rounds into at most `fan_in` runs when there are
    more; each round's tasks run (or are found committed) before the next is planned."""
    level, rounds = parts, 0
    while len(level.sources) > fan_in:
        rounds += 1
        level = context.run_stage(MergeRound(fan_in, rounds), level)
    return level


def merge_groups(count: int, fan_in: int) -> list[tuple[int, int]]:
    """(first, end) of each group of consecutive inputs one merge round makes runs of: the fewest
    groups of at most `fan_in`, their sizes within one of each other (the data decides them,
    never the workers)."""
    if fan_in < 2:
        raise ValueError(f"a merge fan-in of {fan_in}")
    groups = -(-count // fan_in)
    bounds = [count * index // groups for index in range(groups + 1)] if groups else [0]
    return list(zip(bounds[:-1], bounds[1:]))
