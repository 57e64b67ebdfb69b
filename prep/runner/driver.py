"""The runner: drives stages behind the stage protocol (prep/runner/stage.py), skips committed
tasks, runs the rest through the executor, checks what it reuses and commits every task record
and stage manifest. It knows no stage by name: a build is the list of stages it is given."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, NotFoundError
from prep.faults import armed, crash_point
from prep.progress import Progress
from prep.runner.executors.base import Executor
from prep.runner.reuse import Remake, ReuseGuard
from prep.runner.stage import In, Job, Out, Stage, StageRun, Task, TaskPlan
from prep.runner.tasks import BatchResult, JobResult, TableJob, TaskResult, publish_staged, run_table_job
from prep.storage.backend import Store
from prep.store import cas, packs, records

LOOKUP_JOBS = 32
"""Task record lookups in flight at once while planning (threads: each is a GET)."""
COMMIT_JOBS = 16
"""Commits in flight at once (threads: each stores a task's staged files, or PUTs a group's pack)."""
PACK_RECORDS = 1000
"""Task records a pack holds at most (prep.store.packs; 0: no packs written or read, each task
committed by a record of its own). The driver commits settled tasks in groups, one pack a group:
a first build of 600,000 tasks costs 600 PUTs at full speed, and a resume of it reads 600 packs
(under half a second at LOOKUP_JOBS in flight and 20 ms a request); a pack is 0.5-1 MB."""
GROUP_SECONDS = 0.2
"""The longest a settled task waits for others to share its group's PUT: a slow stage still
commits each task within this of its result (the crash that comes sooner reruns it)."""


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


class Runner:
    """One build's runs of stages: what each stage ran and reused, the tasks' logs, and the guard
    over reused objects. `read_back` False (`--no-readback`): files are written without a
    read-back from the disk. Implements prep.runner.stage.StageContext for the stages it runs."""

    def __init__(self, store: Store, executor: Executor, progress: Progress, code: Mapping[str, object],
                 read_back: bool = True) -> None:
        self.store, self.executor, self._progress, self._code = store, executor, progress, code
        self._read_back = read_back
        self.stages: dict[str, StageRun] = {}
        self.logs: dict[str, dict[str, Any]] = {}
        self.guard = StoringGuard(store, executor, progress)
        self._commit_lock = threading.Lock()  # the guard's books and crash-point counts, shared by commit threads

    # -- the context stages see -------------------------------------------------------------
    @property
    def store_url(self) -> str:
        return self.store.url

    @property
    def code(self) -> Mapping[str, object]:
        return self._code

    @property
    def workers(self) -> int:
        return self.executor.workers

    @property
    def driver_stores(self) -> bool:
        # Where workers share this machine's store, the driver stores intermediates (and waits
        # for their fsync) while the workers go on tokenizing.
        return self.executor.shares_filesystem and self.store.local_path("objects") is not None

    @property
    def read_back(self) -> bool:
        return self._read_back

    @property
    def progress(self) -> Progress:
        return self._progress

    def task_key(self, stage: str, settings: Mapping[str, object], *inputs: object) -> str:
        return records.content_key(stage, settings, self._code, *inputs)

    def table_id(self, data: bytes) -> str:
        return hashing.digest_bytes(data).id

    def committed(self, stage: str, keys: Sequence[str]) -> dict[str, records.TaskRecord | None]:
        """Each key's record: from the packs of this plan (or of the one before it), then the
        rest looked up LOOKUP_JOBS at a time (on S3 a lookup is a round trip)."""
        return packs.find_committed(self.store, stage, keys, LOOKUP_JOBS, PACK_RECORDS, self._progress.info)

    def stage_output(self, stage: str) -> str:
        return self.stages[stage].output

    # -- driving stages ---------------------------------------------------------------------
    def run_stages(self, stages: Sequence[Stage[Any, Any]], first: object) -> Any:
        """Run each stage on the result of the one before (the first on `first`); the last result."""
        result: Any = first
        for stage in stages:
            result = self.run_stage(stage, result)
        return result

    def run_stage(self, stage: Stage[In, Out], previous: In) -> Out:
        """Plan the stage, run its missing tasks, commit them and its manifest; its result."""
        plan = stage.plan(previous, self)
        self._progress.stage(stage.name, plan.describe)
        run = self.stages.setdefault(stage.name, StageRun(stage.name))
        ran_before, cached_before = run.ran, run.cached
        committed = self.run_tasks(plan.tasks)
        result = stage.result(previous, plan, committed)
        run.key = records.content_key(stage.name, plan.settings, self._code, plan.key_inputs)
        manifest = result.manifest()
        if manifest is not None:
            self._commit_stage(stage.name, run.key, dict(manifest))
        this_round = StageRun(stage.name, run.key, run.ran - ran_before, run.cached - cached_before)
        self._progress.done(stage.name, stage.done(result, this_round, list(self.logs.get(stage.name, {}).values())))
        return result

    def committed_stages(self) -> list[StageRun]:
        """The stages that committed a manifest, which the snapshot lists (merge commits none)."""
        return [run for run in self.stages.values() if run.output]

    # -- tasks ------------------------------------------------------------------------------
    def run_tasks(self, plan: TaskPlan[Job]) -> dict[str, records.TaskRecord]:
        """Run every task of `plan` whose record is missing (or, for a final stage, whose outputs
        fail their check); return every task's record by key. Missing tasks start heaviest first,
        so the stage ends with small ones."""
        run = self.stages.setdefault(plan.stage, StageRun(plan.stage))
        for object_id, data in plan.tables.items():  # a reused task remade later reads them too
            self.guard.reused([object_id], Remake(f"{plan.stage} part table", run_table_job, TableJob(self.store_url, data)))
        found = plan.found if plan.found is not None else self.committed(plan.stage, [t.key for t in plan.tasks])
        committed: dict[str, records.TaskRecord] = {}
        todo: list[Task[Job]] = []
        spoiled = self._spoiled(plan, found)
        for task in plan.tasks:
            record = found.get(task.key)
            if record is None or task.key in spoiled:
                todo.append(task)
                continue
            committed[task.key] = record
            if not plan.final:
                self.guard.reused(record.outputs.values(), Remake(task.what, plan.run, task.job, task.reads))
        run.cached += len(committed)
        todo.sort(key=lambda task: -task.weight)
        if todo:
            self._store_tables(plan.tables)
        for group in plan.reads(todo) if todo else ():
            self.guard.ensure(group)
        self._run_missing(plan, todo, committed, len(plan.tasks))
        return committed

    def _store_tables(self, tables: Mapping[str, bytes]) -> None:
        """Store the tables a plan's jobs name where they are missing or corrupt, before its tasks run."""
        for object_id in self.guard.find_bad(tables):
            stored = cas.put_bytes(self.store, tables[object_id]).id  # replaces a corrupt copy
            if stored != object_id:
                raise IntegrityError(f"a table to store as {object_id} hashes to {stored}")
            self.guard.produced([stored])

    def _spoiled(self, plan: TaskPlan[Job], found: Mapping[str, records.TaskRecord | None]) -> set[str]:
        """The keys of a final stage's found records whose outputs are missing or corrupt (noted
        as recomputed); none for other stages, whose outputs are checked when read."""
        if not plan.final:
            return set()
        bad = set(self.guard.find_bad(oid for record in found.values() if record for oid in record.outputs.values()))
        spoiled = set()
        for task in plan.tasks:
            record = found.get(task.key)
            for object_id in sorted(bad & set(record.outputs.values())) if record else ():
                self.guard.discard(object_id, task.what)
                spoiled.add(task.key)
        return spoiled

    def _run_missing(self, plan: TaskPlan[Job], todo: list[Task[Job]], committed: dict[str, records.TaskRecord],
                     total: int) -> None:
        """Run `todo` (grouped into jobs by the plan's `batch`) and commit each task as it ends:
        commits go to COMMIT_JOBS threads, so the driver takes the next result meanwhile."""
        run = self.stages[plan.stage]
        jobs: Sequence[Any] = plan.batch(todo, self.executor.workers) if plan.batch and todo else [t.job for t in todo]
        by_key = {task.key: task for task in todo}
        done_bytes, cached = 0, run.cached
        self._progress.tick(plan.stage, len(committed), total, len(committed), force=True)
        returned: dict[int, list[str]] = {}  # each job whose result came back: its tasks' keys

        def landed(key: str, record: records.TaskRecord, log: Any) -> None:
            nonlocal done_bytes
            committed[key] = record
            if log:
                self.logs.setdefault(plan.stage, {})[key] = log
            run.ran += 1
            done_bytes += by_key[key].nbytes

        packed = packs.Plan.of(plan.stage, [task.key for task in plan.tasks])
        serial = armed(f"{plan.stage}.before_commit")
        group = partial(self._commit_group, packed) if PACK_RECORDS and packed.anchors and not serial else None
        try:
            with _Commits(landed, serial, group) as commits:
                with closing(self.executor.run(plan.run, list(jobs))) as results:
                    for index, result in results:
                        keyed = list(_by_task(result, todo[index].key if plan.batch is None else None))
                        returned[index] = [key for key, _ in keyed]
                        for key, outcome in keyed:
                            commits.submit(key, self._store_task, plan.stage, key, outcome, group is None)
                        commits.settle(block=False)
                        self._progress.tick(plan.stage, len(committed), total, cached, done_bytes, force=bool(plan.batch))
                commits.finish()
        except BaseException:
            # Every commit under way has ended (the pool was drained): a job none of whose commits
            # landed may have left staged files that nothing will store (discarding a stored one's is harmless).
            for index, job in enumerate(jobs):
                keys = returned.get(index)
                if keys is None or not all(key in committed for key in keys):
                    plan.discard(job)
            raise
        self._progress.tick(plan.stage, len(committed), total, cached, done_bytes)

    def _store_task(self, stage: str, key: str, result: TaskResult, commit: bool) -> tuple[records.TaskRecord, Any]:
        """Store what the task staged, then (with `commit`) write its own record, which commits it;
        otherwise its group's pack will: nothing is visible before its commit. Runs in a commit
        thread; returns the record and the task's log."""
        result = publish_staged(self.store, result)
        with self._commit_lock:
            self.guard.produced(result.outputs.values())
            self.guard.read_back_when_written(result.read_back)
        for alias_stage, alias_key, names in result.aliases:
            records.write_alias_record(self.store, alias_stage, alias_key,
                                       {alias: result.outputs[name] for alias, name in names})
        if not commit:
            return records.TaskRecord(stage, key, result.outputs, result.summary), result.log
        with self._commit_lock:
            crash_point(f"{stage}.before_commit")
        return records.write_task_record(self.store, stage, key, result.outputs, result.summary), result.log

    def _commit_group(self, plan: packs.Plan, batch: list[records.TaskRecord]) -> None:
        """Commit stored tasks' records as one pack (in a commit thread): one create-only PUT."""
        with self._commit_lock:
            crash_point(f"{plan.stage}.before_group")
        packs.write_pack(self.store, plan, batch)
        with self._commit_lock:
            crash_point(f"{plan.stage}.after_group")

    # -- stage manifests --------------------------------------------------------------------
    def _read_stage(self, stage: str, key: str) -> dict[str, Any] | None:
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
            self._progress.info(f"warning: the {stage} stage manifest is unusable ({exc}); rebuilding it from its tasks")
            self.guard.recomputed.append({"object": record.output, "what": f"{stage} stage manifest"})
            return None
        return records.stage_manifest(self.store, record, raw)

    def _commit_stage(self, stage: str, key: str, manifest: dict[str, Any]) -> None:
        if self._read_stage(stage, key) is None:
            # Storing the manifest replaces a corrupt stored copy (prep.store.cas checks what it finds).
            records.commit_stage(self.store, stage, key, manifest)
        self.stages[stage].output = records.stage_output_id(self.store, stage, key)


@dataclass(frozen=True)
class _Settled:
    """A task whose objects are stored: its record (committed, or waiting for its group) and log."""

    key: str
    record: records.TaskRecord
    log: Any


class _Commits:
    """Task commits in flight in COMMIT_JOBS threads: `landed` gets each committed record (and the
    task's log) on the driver's thread. Without `group`, each task's own commit writes its record
    and they land first in, first out; `serial` (a crash point armed before commits) settles each
    at once, so an injected kill finds exactly the commits before it done. With `group`, a task's
    commit only stores its objects: settled tasks wait (at most PACK_RECORDS of them, at most
    GROUP_SECONDS, watched by a thread of its own so a slow stage commits too) and `group` commits
    them together in a commit thread; they land once it has."""

    def __init__(self, landed: Callable[[str, records.TaskRecord, Any], None], serial: bool,
                 group: Callable[[list[records.TaskRecord]], None] | None = None) -> None:
        self._landed, self._serial, self._group = landed, serial, group
        self._pool = ThreadPoolExecutor(COMMIT_JOBS, thread_name_prefix="prep-commit")
        self._lock = threading.Condition()  # guards everything below; each commit's end notifies it
        self._in_flight: deque[tuple[str, Future[tuple[records.TaskRecord, Any]]]] = deque()
        self._ready: list[_Settled] = []  # stored, waiting for a group (oldest since `_since`)
        self._since = 0.0
        self._groups: deque[tuple[list[_Settled], Future[None]]] = deque()
        self._closing = False
        self._watch = threading.Thread(target=self._watcher, name="prep-groups", daemon=True) if group else None
        if self._watch is not None:
            self._watch.start()

    def __enter__(self) -> _Commits:
        return self

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._watch is not None:
            self._watch.join()
        self._pool.shutdown(wait=True)  # a commit under way finishes: its staged files are its own

    def submit(self, key: str, commit: Callable[..., tuple[records.TaskRecord, Any]], *args: Any) -> None:
        """Start `commit(*args)`, the commit of task `key`."""
        future = self._pool.submit(commit, *args)
        with self._lock:
            self._in_flight.append((key, future))
        future.add_done_callback(self._notify)
        if self._serial:
            self.settle(block=True)

    def _notify(self, _: object) -> None:
        with self._lock:
            self._lock.notify_all()

    def settle(self, block: bool) -> None:
        """Land what is committed (everything, waiting for it, when `block`; the oldest commit
        is waited for whenever more than twice COMMIT_JOBS are in flight); a failure raises here."""
        while True:
            with self._lock:
                oldest = self._in_flight[0][1] if self._in_flight else None
                if oldest is None or not (block or len(self._in_flight) > 2 * COMMIT_JOBS):
                    break
            oldest.result()  # waits; a failed commit raises
            self._harvest(False)  # grouping only by size and age: waiting out the line must not split groups
        self._harvest(block)
        while self._groups and (block or self._groups[0][1].done()):
            settled, future = self._groups.popleft()
            future.result()
            for task in settled:
                self._landed(task.key, task.record, task.log)

    def _harvest(self, flush: bool) -> None:
        """Take the stored tasks at the head of the line and land them (no groups) or group them,
        grouping now when `flush`; a failed commit at the head raises."""
        with self._lock:
            landing = self._take()
            self._flush(flush)
            if self._in_flight and self._in_flight[0][1].done():
                self._in_flight[0][1].result()  # raises the failed commit
        for task in landing:
            self._landed(task.key, task.record, task.log)

    def _take(self) -> list[_Settled]:
        """Pop the done commits at the head of the line, up to a failed one (left for `settle` to
        raise): with groups they wait in `_ready`, without they are returned to land (the lock held)."""
        landing = []
        while self._in_flight and self._in_flight[0][1].done() and self._in_flight[0][1].exception() is None:
            key, future = self._in_flight.popleft()
            task = _Settled(key, *future.result())
            if self._group is None:
                landing.append(task)
                continue
            if not self._ready:
                self._since = time.monotonic()
            self._ready.append(task)
        return landing

    def _flush(self, now: bool) -> None:
        """Hand waiting tasks to commit threads as groups: those of PACK_RECORDS, and the rest
        when `now` or the oldest has waited GROUP_SECONDS (the lock held)."""
        if self._group is None:
            return
        while self._ready and (now or len(self._ready) >= PACK_RECORDS
                               or time.monotonic() - self._since >= GROUP_SECONDS):
            settled, self._ready = self._ready[:PACK_RECORDS], self._ready[PACK_RECORDS:]
            self._since = time.monotonic()
            self._groups.append((settled, self._pool.submit(self._group, [task.record for task in settled])))

    def _watcher(self) -> None:
        """Group what waits once it has waited GROUP_SECONDS, while the driver waits for results."""
        with self._lock:
            while not self._closing:
                self._take()
                self._flush(False)
                self._lock.wait(max(0.0, self._since + GROUP_SECONDS - time.monotonic()) if self._ready else None)

    def finish(self) -> None:
        """Commit and land every task (a failed commit raises)."""
        self.settle(block=True)


def _by_task(result: JobResult, key: str | None) -> Iterable[tuple[str, TaskResult]]:
    """A job's results by task key: a batch's own, or a one-task job's under its task's key."""
    if isinstance(result, BatchResult):
        return result.results
    assert key is not None
    return [(key, result)]

