"""The stage protocol: how a global stage of a build plans its tasks, names what enters their
keys, has one task run on a worker and hands the runner a typed result to commit.

A stage (prep/runner/tokenizing.py, merging.py, ordering.py, sharding.py) never writes a record
and never sees the build's state: it plans `Task`s from the previous stage's result and the
`StageContext` (the store's url, the code identity, the committed task records), and turns the
records the runner committed into its frozen result. The runner (prep/runner/driver.py) looks up
what is committed, runs the rest through the executor, checks reused objects, commits every
task record and the stage manifest, and knows no stage by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from prep.progress import Progress, plural
from prep.runner.tasks import JobResult
from prep.store.records import TaskRecord

Job = TypeVar("Job")
In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", bound="StageResult")


@dataclass
class StageRun:
    """What one stage did in this build: tasks run and tasks served from commit records."""

    name: str
    key: str = ""
    ran: int = 0
    cached: int = 0
    output: str = ""


def stage_counts(run: StageRun) -> str:
    """`3 tasks run, 1 cached`: what a stage did, for its progress line."""
    return f"{plural(run.ran, 'task')} run, {run.cached} cached"



@dataclass(frozen=True)
class Task(Generic[Job]):
    """One task of a stage: the key its outputs are committed under, the job a worker runs, how a
    warning names its outputs, its weight (heavier tasks start first), its input bytes (progress
    rates) and the objects it reads that this build may have reused (checked before it reruns)."""

    key: str
    job: Job
    what: str
    weight: int = 0
    nbytes: int = 0
    reads: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskPlan(Generic[Job]):
    """One round of tasks of a stage and how to run them.

    `run` is a module-level function (workers import it by name) that returns a JobResult.
    `found` holds task records the stage looked up already (None: missing), not read again.
    `reads(missing)` are the groups of objects the missing tasks read, made trustworthy (checked,
    remade when bad) before any of them runs. With `final` the outputs are the snapshot's own
    files: a found record whose outputs fail their check is run again now; otherwise a found
    record's outputs are checked only when something reads them, and remade by their task.
    `batch(missing, workers)` groups tasks into jobs of several tasks each (a final stage only;
    default: one job per task); a job of several tasks returns one JobResult per task key."""

    stage: str
    tasks: tuple[Task[Job], ...]
    run: Callable[[Any], JobResult]
    found: Mapping[str, TaskRecord | None] | None = None
    reads: Callable[[Sequence[Task[Job]]], Sequence[Sequence[str]]] = lambda missing: ()
    final: bool = False
    batch: Callable[[Sequence[Task[Job]], int], Sequence[Any]] | None = None
    discard: Callable[[Any], None] = lambda job: None
    """Remove what a job that will never be committed left behind (its staged files)."""
    tables: Mapping[str, bytes] = field(default_factory=dict)
    """Objects the jobs name by id instead of carrying them (packed tables every task reads, whose
    size follows the corpus), by object id: the runner stores them before any task of the plan
    can run, and workers read them once per process (prep.runner.tasks.stored_table)."""


class StageResult(Protocol):
    """What a stage hands the runner: a frozen value the next stage reads, and its manifest."""

    def manifest(self) -> Mapping[str, object] | None:
        """The stage manifest the runner commits (without schema, stage and key), or None when
        the stage commits none (the merge level: its runs are no part of any snapshot)."""
        ...


class StageContext(Protocol):
    """What a stage may ask of the runner while it plans: no more (never the build's state)."""

    @property
    def store_url(self) -> str: ...

    @property
    def code(self) -> Mapping[str, object]: ...

    @property
    def workers(self) -> int: ...

    @property
    def driver_stores(self) -> bool:
        """Whether workers leave their outputs staged on this machine for the driver to store."""
        ...

    @property
    def read_back(self) -> bool: ...

    @property
    def progress(self) -> Progress: ...

    def task_key(self, stage: str, settings: Mapping[str, object], *inputs: object) -> str:
        """A task's key: its stage, settings, the code identity and its inputs, hashed."""
        ...

    def table_id(self, data: bytes) -> str:
        """The object id a packed table will be stored under (TaskPlan.tables)."""
        ...

    def committed(self, stage: str, keys: Sequence[str]) -> dict[str, TaskRecord | None]:
        """The committed task record of each key, None where there is none."""
        ...

    def stage_output(self, stage: str) -> str:
        """The id of the manifest a stage of this build committed (what later stage keys name)."""
        ...

    def run_stage(self, stage: Stage[In, Out], previous: In) -> Out:
        """Run a stage nested in this one (the merge level, planned by the order stage)."""
        ...


class Stage(Protocol[In, Out]):
    """A global stage: `plan` its tasks from the previous stage's result, then `result` over the
    records the runner committed for them. `settings` and `key_inputs` make its stage key."""

    @property
    def name(self) -> str:
        """The stage's name in records, manifests and progress lines."""
        ...

    def plan(self, previous: In, context: StageContext) -> StagePlan:
        """The stage's tasks, what its stage key names, and its progress line."""
        ...

    def result(self, previous: In, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Out:
        """The stage's typed result from its committed task records."""
        ...

    def done(self, result: Out, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        """The progress line of a finished stage, from its result, its counts and its tasks' logs."""
        ...


@dataclass(frozen=True)
class StagePlan:
    """A stage's tasks with the settings and inputs its stage key names, and what it will do."""

    tasks: TaskPlan[Any]
    settings: Mapping[str, object]
    key_inputs: object
    describe: str
