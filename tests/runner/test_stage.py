"""The stage protocol, proven with toy stages defined here: the runner plans, runs, commits and
reuses them without a line of its own code knowing them (prep/runner/stage.py, driver.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from prep.progress import Progress
from prep.runner.driver import Runner
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan
from prep.runner.tasks import BatchResult, TaskResult, worker_store
from prep.storage import LocalStore
from prep.storage.backend import MAX_BODY_BYTES
from prep.store import cas, records
from tests.runner.buildsupport import InProcessExecutor
from tests.runner.test_reuse import flip_byte, object_path

CODE = {"prep": "toy"}


@dataclass(frozen=True)
class UpperJob:
    """Store one text in upper case."""

    store_url: str
    text: str


def run_upper(job: UpperJob) -> TaskResult:
    stored = cas.put_bytes(worker_store(job.store_url), job.text.upper().encode())
    return TaskResult({"upper": stored.id}, {"length": len(job.text)}, {"ran": 1})


@dataclass(frozen=True)
class Uppered:
    """The toy stage's result: each text's object and length, in input order."""

    objects: tuple[str, ...]
    lengths: tuple[int, ...]

    def manifest(self) -> None:
        return None


@dataclass(frozen=True)
class Uppering:
    """A toy stage: one task per text."""

    suffix: str = ""
    name: str = "upper"

    def plan(self, previous: tuple[str, ...], context: StageContext) -> StagePlan:
        tasks = tuple(Task(context.task_key(self.name, {"suffix": self.suffix}, text),
                           UpperJob(context.store_url, text + self.suffix), f"text {index}", weight=len(text))
                      for index, text in enumerate(previous))
        return StagePlan(TaskPlan(self.name, tasks, run_upper), {"suffix": self.suffix}, [t.key for t in tasks],
                         f"{len(tasks)} texts")

    def result(self, previous: tuple[str, ...], plan: StagePlan,
               committed: Mapping[str, records.TaskRecord]) -> Uppered:
        found = [committed[task.key] for task in plan.tasks.tasks]
        return Uppered(tuple(r.outputs["upper"] for r in found), tuple(int(r.summary["length"]) for r in found))

    def done(self, result: Uppered, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{run.ran} run, {run.cached} cached, {len(logs)} logs"


@dataclass(frozen=True)
class JoinJob:
    """Several join tasks in one job: each hashes one stored object."""

    store_url: str
    keys: tuple[str, ...]
    objects: tuple[str, ...]


def run_join(job: JoinJob) -> BatchResult:
    store = worker_store(job.store_url)
    results = []
    for key, object_id in zip(job.keys, job.objects):
        digest = hashlib.sha256(cas.get_bytes(store, object_id)).hexdigest()
        stored = cas.put_bytes(store, digest.encode())
        results.append((key, TaskResult({"digest": stored.id}, {}, {})))
    return BatchResult(tuple(results))


@dataclass(frozen=True)
class Joined:
    objects: tuple[str, ...]

    def manifest(self) -> None:
        return None


@dataclass(frozen=True)
class Joining:
    """A toy final stage whose tasks run two to a job, the way the shard stage groups units."""

    name: str = "join"

    def plan(self, previous: Uppered, context: StageContext) -> StagePlan:
        tasks = tuple(Task(context.task_key(self.name, {}, object_id), object_id, f"digest of {object_id}",
                           reads=(object_id,)) for object_id in previous.objects)

        def batch(missing: Sequence[Task[str]], workers: int) -> list[JoinJob]:
            return [JoinJob(context.store_url, tuple(t.key for t in missing[at:at + 2]),
                            tuple(t.job for t in missing[at:at + 2])) for at in range(0, len(missing), 2)]

        return StagePlan(TaskPlan(self.name, tasks, run_join, final=True, batch=batch,
                                  reads=lambda missing: [[object_id for t in missing for object_id in t.reads]]),
                         {}, [t.key for t in tasks], f"{len(tasks)} digests")

    def result(self, previous: Uppered, plan: StagePlan, committed: Mapping[str, records.TaskRecord]) -> Joined:
        return Joined(tuple(committed[task.key].outputs["digest"] for task in plan.tasks.tasks))

    def done(self, result: Joined, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{run.ran} joined"


def _runner(store: LocalStore) -> Runner:
    return Runner(store, InProcessExecutor(), Progress(quiet=True), CODE)


TEXTS = ("alpha", "be", "gamma delta", "e")


def test_a_toy_stage_runs_commits_and_is_reused_without_the_runner_knowing_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    runner = _runner(store)
    first = runner.run_stages([Uppering(), Joining()], TEXTS)
    assert runner.stages["upper"].ran == 4 and runner.stages["join"].ran == 4
    upper = runner.run_stage(Uppering(), TEXTS)
    assert [cas.get_bytes(store, object_id) for object_id in upper.objects] == [t.upper().encode() for t in TEXTS]
    assert upper.lengths == tuple(len(t) for t in TEXTS) and runner.stages["upper"].cached == 4
    assert [cas.get_bytes(store, d).decode() for d in first.objects] == \
        [hashlib.sha256(t.upper().encode()).hexdigest() for t in TEXTS]
    assert runner.logs["upper"] and all(log == {"ran": 1} for log in runner.logs["upper"].values())
    again = _runner(store)
    assert again.run_stages([Uppering(), Joining()], TEXTS) == first
    assert (again.stages["upper"].ran, again.stages["upper"].cached) == (0, 4)
    assert (again.stages["join"].ran, again.stages["join"].cached) == (0, 4)


def test_a_setting_that_enters_the_key_reruns_the_stage_and_what_follows(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _runner(store).run_stages([Uppering(), Joining()], TEXTS)
    changed = _runner(store)
    changed.run_stages([Uppering("!"), Joining()], TEXTS)
    assert changed.stages["upper"].ran == 4 and changed.stages["join"].ran == 4


def test_a_bad_output_of_a_final_stage_is_written_again_and_a_bad_reused_input_remade(tmp_path: Path) -> None:
    """A final stage's rotten output reruns its task (and no other); the reused object that task
    reads, found missing, is remade by the task of the earlier stage that made it."""
    store = LocalStore(tmp_path / "store")
    first = _runner(store).run_stages([Uppering(), Joining()], TEXTS)
    upper = _runner(store).run_stage(Uppering(), TEXTS)
    flip_byte(object_path(tmp_path / "store", first.objects[1]), 3)
    object_path(tmp_path / "store", upper.objects[1]).unlink()
    runner = _runner(store)
    assert runner.run_stages([Uppering(), Joining()], TEXTS) == first
    assert cas.check(store, first.objects[1]) and cas.check(store, upper.objects[1])
    assert {item["object"] for item in runner.guard.recomputed} == {first.objects[1], upper.objects[1]}
    assert (runner.stages["upper"].ran, runner.stages["join"].ran) == (0, 1)


TOY_RUN = """
import sys
from pathlib import Path
from prep.storage import LocalStore
from prep.storage.backend import MAX_BODY_BYTES
from tests.runner.test_stage import TEXTS, Joining, Uppering, _runner
result = _runner(LocalStore(Path(sys.argv[1]))).run_stages([Uppering(), Joining()], TEXTS)
print(" ".join(result.objects))
"""


@pytest.mark.parametrize("point", ["upper.before_commit:1", "upper.before_commit:3", "join.before_commit:2"])
def test_a_kill_before_any_commit_replays_to_the_same_result(tmp_path: Path, point: str) -> None:
    """A crash point named after the stage, in the runner, before every task record it writes."""
    root = Path(__file__).resolve().parents[2]
    store = tmp_path / "store"
    env = {**os.environ, "PREP_CRASH_AT": f"{point}:self"}
    killed = subprocess.run([sys.executable, "-c", TOY_RUN, str(store)], cwd=root, env=env, capture_output=True,
                            text=True, check=False)
    assert killed.returncode == -9, killed.stderr
    stage, _, nth = point.partition(".before_commit:")
    assert len(list((store / "tasks" / stage).glob("*.json"))) == int(nth) - 1
    rerun = subprocess.run([sys.executable, "-c", TOY_RUN, str(store)], cwd=root, capture_output=True, text=True,
                           check=True)
    fresh = subprocess.run([sys.executable, "-c", TOY_RUN, str(tmp_path / "fresh")], cwd=root, capture_output=True,
                           text=True, check=True)
    assert rerun.stdout == fresh.stdout


class SlowStore(LocalStore):
    """A local store whose reads take a round trip's time, noting how many run at once."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.in_flight = self.most = 0
        self._lock = threading.Lock()

    def get_bytes(self, key: str, limit: int = MAX_BODY_BYTES) -> bytes:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            time.sleep(0.02)
            return super().get_bytes(key, limit)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_planning_looks_records_up_many_at_a_time_and_keeps_each_keys_answer(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "store")
    keys = [f"{index:064x}" for index in range(200)]
    for key in keys[::3]:
        records.write_task_record(store, "toy", key, {"out": f"sha256:{key}"}, {})
    found = Runner(store, InProcessExecutor(), Progress(quiet=True), CODE).committed("toy", keys)
    assert list(found) == keys
    assert all((record is not None) == (index % 3 == 0) for index, record in enumerate(found.values()))
    assert all(record.key == key for key, record in found.items() if record is not None)
    assert store.most > 1
