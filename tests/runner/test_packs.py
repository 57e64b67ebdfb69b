"""The driver commits settled tasks in groups, one pack a group (prep/store/packs.py), and planning
reads the packs first and lists single records instead of asking for each: proven on a store that
counts requests, on a first build, a rerun and resumes after kills before, between and after
group commits; damaged packs are ignored (their tasks run again) and the build still gives the
clean build's snapshot id."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner import driver
from prep.runner.build import build
from prep.runner.driver import Runner
from prep.storage import LocalStore
from prep.store import records
from prep.store.layout import PACKS_PREFIX, TASKS_PREFIX
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, RequestCountingStore
from tests.runner.test_stage import CODE, Uppering
from tests.store.test_packs import DAMAGES, corrupt

TASKS = 2000
TEXTS = tuple(f"text {index}" for index in range(TASKS))
KILLED = """
import sys
import time
from pathlib import Path
from typing import Any
from prep.runner import driver
from prep.storage import LocalStore
from tests.runner.test_stage import Uppering, _runner
from tests.runner.test_packs import TEXTS
driver.PACK_RECORDS = int(sys.argv[2])
_runner(LocalStore(Path(sys.argv[1]))).run_stage(Uppering(), TEXTS)
"""


def planned(store: RequestCountingStore) -> tuple[int, int]:
    """(requests, tasks found committed) of planning the toy stage over TEXTS on `store`."""
    runner = Runner(store, InProcessExecutor(), Progress(quiet=True), CODE)
    keys = [task.key for task in Uppering().plan(TEXTS, runner).tasks.tasks]
    before = store.total()
    found = runner.committed("upper", keys)  # what the runner asks when it runs the plan
    return store.total() - before, sum(record is not None for record in found.values())


def run(store: LocalStore) -> tuple[tuple[str, ...], int]:
    """The toy stage's objects over TEXTS, and how many of its tasks ran."""
    runner = Runner(store, InProcessExecutor(), Progress(quiet=True), CODE)
    return runner.run_stage(Uppering(), TEXTS).objects, runner.stages["upper"].ran


def commits(store: RequestCountingStore) -> list[str]:
    """The keys of every pack and single record in the store."""
    return [info.key for prefix in (PACKS_PREFIX, TASKS_PREFIX) for info in store.list(prefix)]


def test_a_first_build_commits_in_groups_and_asks_nothing_a_task(tmp_path: Path) -> None:
    """2,000 tasks: planning lists (no GET for a task never committed) and the commits are a few
    packs, not a PUT a task; a rerun plans from the packs in a request a pack and runs nothing."""
    store = RequestCountingStore(tmp_path / "store")
    requests, found = planned(store)
    assert found == 0 and requests <= 2 + 2, requests  # the anchors' folders, the stage's records (one page)
    first, ran = run(store)
    written = commits(store)
    assert ran == TASKS and not [key for key in written if key.startswith(TASKS_PREFIX)]
    assert 2 <= len(written) <= TASKS // 20, len(written)
    assert store.requests["put"] <= TASKS + len(written) + 1, "an object a task (its worker's), a PUT a pack"
    assert not [key for key in store.got if key.startswith(TASKS_PREFIX)], "no GET of a task record"
    requests, found = planned(store)
    assert found == TASKS and requests <= 2 + len(written), requests
    assert run(store) == (first, 0)


@pytest.mark.parametrize("point", ["upper.before_commit:1951", "upper.before_group:5", "upper.after_group:5"])
def test_a_resume_after_a_kill_runs_only_the_uncommitted_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               point: str) -> None:
    """Killed with 100 records a pack: after 1,950 single commits (a crash point armed before
    commits: one record a task), or before or after the fifth group's PUT. The resume finds the
    committed tasks in packs (or, for single records, by one listing and a GET each, packing
    them), runs exactly the others and ends where a clean run does; a second resume needs packs only."""
    monkeypatch.setattr(driver, "PACK_RECORDS", 100)
    root = Path(__file__).resolve().parents[2]
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "store"), "100"],
                            cwd=root, env={**os.environ, "PREP_CRASH_AT": f"{point}:self"}, capture_output=True, text=True,
                            check=False)
    assert killed.returncode == -9, killed.stderr
    store = RequestCountingStore(tmp_path / "store")
    singles = len(list(store.list(TASKS_PREFIX)))
    before_resume = len(list(store.list(PACKS_PREFIX)))
    requests, found = planned(store)
    if point.startswith("upper.before_commit"):
        assert found == singles == 1950 and store.requests["get"] == 1950, "a GET for each listed record only"
    else:
        assert singles == 0 and (0 if "before" in point else 1) <= found < TASKS, found
        assert requests <= 2 + before_resume + 2, requests  # no GET for an uncommitted task
    objects, ran = run(store)
    assert ran == TASKS - found, "only the tasks not committed before the kill run again"
    assert objects == run(LocalStore(tmp_path / "fresh"))[0]
    requests, found = planned(store)
    assert found == TASKS and requests <= 2 + len(list(store.list(PACKS_PREFIX))), requests


class SlowExecutor(InProcessExecutor):
    """Runs tasks in this process, but before handing over each result after the first waits
    until the store holds as many packs as results handed over: a slow stage, whose driver waits
    for results while earlier tasks wait for their group."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.waited: list[float] = []

    def run(self, fn: Any, items: Any) -> Any:
        for index, item in enumerate(items):
            start = time.monotonic()
            while len(list(self.store.list(PACKS_PREFIX))) < index and time.monotonic() - start < 10:
                time.sleep(0.01)
            self.waited.append(time.monotonic() - start)
            yield index, fn(item)


def test_a_slow_stage_commits_each_task_while_the_driver_waits_for_the_next(tmp_path: Path) -> None:
    """Each result is committed (its group's pack stored) within about GROUP_SECONDS while the
    driver waits for the next result, not when the next result or the stage's end comes."""
    store = LocalStore(tmp_path / "store")
    executor = SlowExecutor(store)
    runner = Runner(store, executor, Progress(quiet=True), CODE)
    runner.run_stage(Uppering(), TEXTS[:4])
    assert len(list(store.list(PACKS_PREFIX))) == 4 and max(executor.waited) < driver.GROUP_SECONDS + 2, executor.waited
    found = runner.committed("upper", [task.key for task in Uppering().plan(TEXTS[:4], runner).tasks.tasks])
    assert all(found.values()), "every task committed, one pack each"


def stored_slowly(index: int) -> tuple[records.TaskRecord, None]:
    """A task commit that takes 10 ms to store its objects; its record, not yet committed."""
    time.sleep(0.01)
    return records.TaskRecord("upper", f"{index:064x}", {"upper": f"sha256:{index:064x}"}, {}), None


def test_a_stage_end_commits_what_waits_in_one_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: waiting out the commits in flight at a stage's end grouped after each one it
    waited for, so a stage's last tasks were committed a PUT each; they are one group, landed
    only once it is committed."""
    monkeypatch.setattr(driver, "GROUP_SECONDS", 30.0)
    groups: list[list[records.TaskRecord]] = []
    landed: list[str] = []
    with driver._Commits(lambda key, record, log: landed.append(key), False, groups.append) as commits:
        for index in range(100):
            commits.submit(f"{index:064x}", stored_slowly, index)
        assert not landed, "nothing lands before its group is committed"
        commits.finish()
    assert len(groups) == 1 and len(groups[0]) == 100 and sorted(landed) == [f"{i:064x}" for i in range(100)]


def test_a_build_that_appends_a_file_reads_the_packs_of_the_build_before(tmp_path: Path, tokenizer_path: Path) -> None:
    """The appended build's tokenize plan differs from the first's by one part, yet it finds the
    first build's packs (by the plan's smallest key): it looks up only its new part's record, and
    a rerun of it none."""
    for index in range(6):
        write_jsonl(tmp_path / "corpus" / f"part-{index}.jsonl", make_records(20, seed=index, prefix=f"p{index}"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, shard_size="3KB")
    build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), InProcessExecutor(), (), Progress(quiet=True))
    write_jsonl(tmp_path / "corpus" / "part-6.jsonl", make_records(20, seed=6, prefix="p6"))
    for looked_up in (1, 0):
        store = RequestCountingStore(tmp_path / "store")
        result = build(load_pipeline(pipeline), store, InProcessExecutor(), (), Progress(quiet=True))
        assert result.stages["tokenize"].cached == 7 - looked_up
        assert len([key for key in store.got if key.startswith("tasks/tokenize/")]) == looked_up, store.got


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("packs")
    for index in range(4):
        write_jsonl(root / "corpus" / f"part-{index}.jsonl", make_records(30, seed=index, prefix=f"p{index}"))
    pipeline = write_pipeline(root, tokenizer_path, shard_size="3KB")
    snapshot = run_prep("build", pipeline, "--store", root / "store", "--workers", "1").stdout.split()[-1]
    return pipeline, root / "store", snapshot


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_build_over_damaged_packs_ignores_them_and_gives_the_same_snapshot(
        built: tuple[Path, Path, str], tmp_path: Path, damage: str) -> None:
    pipeline, clean, snapshot = built
    shutil.copytree(clean, tmp_path / "store", symlinks=True)
    store = LocalStore(tmp_path / "store")
    damaged = sorted(info.key for info in store.list(PACKS_PREFIX))
    assert {key.split("/")[1] for key in damaged} == {"tokenize", "order", "shard"}
    for key in damaged:
        corrupt(store, key, damage)
    rebuilt = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1")
    assert rebuilt.stdout.split()[-1] == snapshot
    assert rebuilt.stderr.count("unusable task pack is ignored") == len(damaged), rebuilt.stderr
