"""Crash replay: a build killed with SIGKILL anywhere, then rerun, ends exactly where an
uninterrupted build does, and committed tasks are not recomputed."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.helpers import make_records, prep_env, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import all_objects_intact

FILES = 5


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("crash")
    for index in range(FILES):
        write_jsonl(root / "corpus" / f"part-{index}.jsonl", make_records(40, seed=index, prefix=f"p{index}"))
    pipeline = write_pipeline(root, tokenizer_path, shard_size="3KB")
    clean = run_prep("build", pipeline, "--store", root / "clean", "--workers", "2")
    return pipeline, clean.stdout.split()[-1]


def _last_log(store: Path) -> dict[str, dict[str, int]]:
    logs = sorted((store / "logs" / "tiny").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return dict(json.loads(logs[-1].read_text())["stages"])


def _kill_and_rerun(pipeline: Path, store: Path, point: str, workers: str = "2") -> str:
    """Build killed at `point`: nothing published, every stored object intact; then the rerun's
    snapshot id (its objects intact too)."""
    crashed = run_prep("build", pipeline, "--store", store, "--workers", workers, check=False,
                       env=prep_env(PREP_CRASH_AT=point), new_session=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (store / "refs" / "tiny" / "latest.json").exists()
    assert all_objects_intact(store)
    snapshot_id = run_prep("build", pipeline, "--store", store, "--workers", "2").stdout.split()[-1]
    assert all_objects_intact(store)
    return snapshot_id


@pytest.mark.parametrize("point", [
    "tokenize.after_output:2",
    "tokenize.before_commit:3",
    "tokenize.before_group",
    "tokenize.after_group",
    "store.before_link:4",
    "order.before_commit",
    "shard.mid_write:2",
    "shard.after_write",
    "shard.between_puts:2",
    "shard.before_commit:2",
    "shard.before_group",
    "shard.after_group",
    "publish.before_refs",
])
def test_killed_build_reruns_to_the_same_snapshot(project: tuple[Path, str], tmp_path: Path, point: str) -> None:
    pipeline, expected = project
    store = tmp_path / "store"
    workers = "1" if point.startswith("tokenize.before_commit") else "2"
    assert _kill_and_rerun(pipeline, store, point, workers) == expected
    for record in [*(store / "tasks").rglob("*.json"), *(store / "stages").rglob("*.json"),
                   *(store / "packs").rglob("*.json")]:
        json.loads(record.read_text())  # never a partial record (or pack) under its final name
    stages = _last_log(store)
    if point == "tokenize.before_commit:3":
        # one worker: two tasks were committed before the kill and must not run again
        assert stages["tokenize"]["cached"] == 2 and stages["tokenize"]["ran"] == FILES - 2
    stage = point.split(".")[0]
    if point.endswith("before_group"):  # killed before the stage's first group commit: it all runs again
        assert stages[stage]["cached"] == 0 and stages[stage]["ran"] > 0
    if point.endswith("after_group"):  # killed once its first group was committed: those tasks run no more
        assert stages[stage]["cached"] > 0
    if point.startswith(("order", "shard", "publish")):
        assert stages["tokenize"]["ran"] == 0 and stages["tokenize"]["cached"] == FILES
    if point in ("shard.before_commit:2", "publish.before_refs"):
        assert stages["order"]["ran"] == 0
    if point == "publish.before_refs":
        assert stages["shard"]["ran"] == 0


@pytest.mark.parametrize("point", ["merge.after_write:2", "merge.before_commit:3"])
def test_killed_merge_reruns_to_the_snapshot_of_an_unmerged_build(project: tuple[Path, str], tmp_path: Path,
                                                                  point: str) -> None:
    """Five parts merged in pairs (three merges in two rounds), killed in a merge task or before its
    commit; the rerun redoes only uncommitted merges and publishes what a build without merging does."""
    pipeline, expected = project
    merged = pipeline.with_name("merged.toml")
    merged.write_text(pipeline.read_text() + "\n[build]\nmerge_fan_in = 2\n")
    store = tmp_path / "store"
    assert _kill_and_rerun(merged, store, point, workers="1") == expected
    stages = _last_log(store)
    assert stages["tokenize"]["ran"] == 0 and stages["merge"]["ran"] + stages["merge"]["cached"] == 3
    committed = int(point.split(":")[1]) - 1  # before the kill (in the driver: exactly; in a worker: at most)
    assert stages["merge"]["cached"] == committed if "before_commit" in point else stages["merge"]["cached"] <= committed


@pytest.mark.parametrize("point", ["shard.mid_write", "shard.after_write", "shard.between_puts:2",
                                   "shard.before_commit:2"])
def test_killed_write_of_one_shard_reruns_to_the_same_snapshot(project: tuple[Path, str], tmp_path: Path,
                                                               point: str) -> None:
    """One large shard whose .bin/.idx and .tar are written by two workers at once, killed midway;
    a file committed before the kill is not written again."""
    pipeline, _ = project
    big = pipeline.with_name("one-shard.toml")
    big.write_text(pipeline.read_text().replace('shard_size = "3KB"', 'shard_size = "1MB"'))
    expected = run_prep("build", big, "--store", tmp_path / "clean", "--workers", "1").stdout.split()[-1]
    store = tmp_path / "store"
    assert _kill_and_rerun(big, store, point) == expected
    stages = _last_log(store)
    assert stages["tokenize"]["ran"] == 0
    if point == "shard.before_commit:2":
        assert stages["shard"]["ran"] == 1 and stages["shard"]["cached"] == 1
    else:
        assert stages["shard"]["ran"] + stages["shard"]["cached"] == 2


_KILLED_SPILL = """
import sys
from pathlib import Path
import prep.stages.idcheck as idcheck
import prep.stages.read as read
from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import build
from prep.storage import LocalStore
from tests.runner.buildsupport import InProcessExecutor
read.RANGE_BYTES, idcheck.IDS_PER_PARTITION = 1500, 7
build(load_pipeline(Path(sys.argv[1])), LocalStore(Path(sys.argv[2])), InProcessExecutor(), (), Progress(quiet=True))
"""


def test_a_build_killed_while_spilling_ids_reruns_to_the_same_snapshot_and_gc_takes_the_spill(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL in the middle of a split file's id check (its ids partly spilled to the store's
    tmp/): nothing is published, a rerun publishes the clean build's snapshot, and gc deletes the
    stale spill folder once it is older than the grace period."""
    import os
    import subprocess
    import sys
    import time

    import prep.stages.idcheck as idcheck
    import prep.stages.read as read
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.storage import LocalStore
    from prep.store.gc import collect_garbage
    from tests.runner.buildsupport import InProcessExecutor

    write_jsonl(tmp_path / "corpus" / "big.jsonl", make_records(60, seed=4))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    store = tmp_path / "store"
    killed = subprocess.run([sys.executable, "-c", _KILLED_SPILL, str(pipeline), str(store)], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[2],
                            env=prep_env(PREP_CRASH_AT="idcheck.mid_spill:2:self"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    spills = list((store / "tmp").glob("prep-idcheck-*"))
    assert len(spills) == 1 and list(spills[0].iterdir()), "the killed check left its spill behind"
    assert not (store / "refs").exists()

    monkeypatch.setattr(read, "RANGE_BYTES", 1500)
    monkeypatch.setattr(idcheck, "IDS_PER_PARTITION", 7)
    rerun = build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))
    clean = build(load_pipeline(pipeline), LocalStore(tmp_path / "clean"), InProcessExecutor(), (), Progress(quiet=True))
    assert rerun.snapshot.id == clean.snapshot.id
    moment = time.time() - 7200
    for path in [spills[0], *spills[0].rglob("*")]:
        os.utime(path, (moment, moment))
    collect_garbage(LocalStore(store), grace_seconds=3600)
    assert not spills[0].exists()


STEPS = ('\n[[steps]]\nuse = "length"\nmin_words = 10\n\n[[steps]]\nuse = "gopher_repetition"\n'
         '\n[[steps]]\nuse = "length"\nmax_chars = 300\n')


@pytest.fixture(scope="module")
def with_steps(project: tuple[Path, str], tokenizer_path: Path) -> tuple[Path, str]:
    """The crash corpus with document steps: each tokenize task also stores each step's outcomes."""
    pipeline = write_pipeline(project[0].parent, tokenizer_path, shard_size="3KB", extra=STEPS, name="steps.toml")
    clean = run_prep("build", pipeline, "--store", project[0].parent / "clean-steps", "--workers", "2")
    return pipeline, clean.stdout.split()[-1]


@pytest.mark.parametrize("point", ["tokenize.after_output:2", "tokenize.before_commit:3", "store.before_link:4"])
def test_a_build_with_steps_killed_in_tokenize_reruns_to_the_same_snapshot(with_steps: tuple[Path, str],
                                                                           tmp_path: Path, point: str) -> None:
    """Each step's outcomes object is one more output of a tokenize task: a kill while the task
    stores them, or before its record, leaves nothing visible, and what the kill left staged is a
    temporary gc takes like the intermediate staged beside it."""
    pipeline, expected = with_steps
    store = tmp_path / "store"
    assert _kill_and_rerun(pipeline, store, point, "1" if "before_commit" in point else "2") == expected
    run_prep("gc", "--grace", "0s", "--store", store)
    assert not any(re.search(r"\.step[0-9]+$", path.name) for path in (store / "tmp").rglob("*"))


def test_reordering_steps_changes_the_snapshot(with_steps: tuple[Path, str], tokenizer_path: Path,
                                               tmp_path: Path) -> None:
    """The steps' order enters the tokenize key: the same steps in another order are another build,
    even when they happen to keep the same documents."""
    pipeline, expected = with_steps
    swapped = STEPS.split("\n\n[[steps]]")
    reordered = write_pipeline(pipeline.parent, tokenizer_path, shard_size="3KB", name="reordered.toml",
                               extra="\n\n[[steps]]".join([swapped[0].replace("min_words = 10", "max_chars = 300"),
                                                           *swapped[1:-1], swapped[-1].replace("max_chars = 300",
                                                                                               "min_words = 10")]))
    other = run_prep("build", reordered, "--store", tmp_path / "store", "--workers", "2").stdout.split()[-1]
    assert other != expected
