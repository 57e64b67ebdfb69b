"""A resumed build plans only what is not committed, without a request per committed task: the
driver packs its task records (prep/store/packs.py) and planning reads the packs first. Proven on
a store that counts requests, after a rerun and after kills between records and packs; damaged
packs are ignored and the build still gives the clean build's snapshot id."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner import driver
from prep.runner.build import build
from prep.runner.driver import Runner
from prep.storage import LocalStore
from prep.store.layout import PACKS_PREFIX
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, RequestCountingStore
from tests.runner.test_stage import CODE, Uppering
from tests.store.test_packs import DAMAGES, corrupt

TASKS = 2000
TEXTS = tuple(f"text {index}" for index in range(TASKS))
KILLED = """
import sys
from pathlib import Path
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


def run(store: LocalStore) -> tuple[str, ...]:
    return Runner(store, InProcessExecutor(), Progress(quiet=True), CODE).run_stage(Uppering(), TEXTS).objects


def test_a_rerun_plans_2000_committed_tasks_in_a_few_requests(tmp_path: Path) -> None:
    store = RequestCountingStore(tmp_path / "store")
    first = run(store)
    assert len(list(store.list(PACKS_PREFIX))) == TASKS // driver.PACK_RECORDS
    requests, found = planned(store)
    assert found == TASKS and requests <= 10, requests  # 2 LISTs, 2 pack GETs
    assert run(store) == first


@pytest.mark.parametrize("point", ["upper.before_commit:1951", "upper.before_pack:20"])
def test_a_resume_after_a_kill_looks_up_only_the_unpacked_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 point: str) -> None:
    """Killed with 100 records a pack, after 1,950 commits or before the pack of the last 100: the
    resume reads the packs and looks up at most the unpacked records and the uncommitted tasks one
    by one; it ends where a clean run does, and a second resume needs packs only."""
    monkeypatch.setattr(driver, "PACK_RECORDS", 100)
    root = Path(__file__).resolve().parents[2]
    killed = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "store"), "100"],
                            cwd=root, env={**os.environ, "PREP_CRASH_AT": f"{point}:self"}, capture_output=True, text=True,
                            check=False)
    assert killed.returncode == -9, killed.stderr
    store = RequestCountingStore(tmp_path / "store")
    requests, found = planned(store)
    assert found >= 1900 and requests <= 2 + TASKS // 100 + 2 * 100 + 16, (requests, found)
    assert run(store) == run(LocalStore(tmp_path / "fresh"))
    requests, found = planned(store)
    assert found == TASKS and requests <= 2 + TASKS // 100 + 2, requests


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
