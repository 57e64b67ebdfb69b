"""Crash replay: a build killed with SIGKILL anywhere, then rerun, ends exactly where an
uninterrupted build does, and committed tasks are not recomputed."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("point", [
    "tokenize.after_output:2",
    "tokenize.before_commit:3",
    "store.before_link:4",
    "order.before_commit",
    "shard.mid_write:2",
    "shard.after_write",
    "shard.between_puts:2",
    "shard.before_commit:2",
    "publish.before_refs",
])
def test_killed_build_reruns_to_the_same_snapshot(project: tuple[Path, str], tmp_path: Path, point: str) -> None:
    pipeline, expected = project
    store = tmp_path / "store"
    workers = "1" if point.startswith("tokenize.before_commit") else "2"
    crashed = run_prep("build", pipeline, "--store", store, "--workers", workers, check=False,
                       env=prep_env(PREP_CRASH_AT=point), new_session=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (store / "refs" / "tiny" / "latest.json").exists()
    assert all_objects_intact(store)

    rerun = run_prep("build", pipeline, "--store", store, "--workers", "2")
    assert rerun.stdout.split()[-1] == expected
    assert all_objects_intact(store)
    for record in [*(store / "tasks").rglob("*.json"), *(store / "stages").rglob("*.json")]:
        json.loads(record.read_text())  # never a partial record under its final name
    stages = _last_log(store)
    if point == "tokenize.before_commit:3":
        # one worker: two tasks were committed before the kill and must not run again
        assert stages["tokenize"]["cached"] == 2 and stages["tokenize"]["ran"] == FILES - 2
    if point.startswith(("order", "shard", "publish")):
        assert stages["tokenize"]["ran"] == 0 and stages["tokenize"]["cached"] == FILES
    if point in ("shard.before_commit:2", "publish.before_refs"):
        assert stages["order"]["ran"] == 0
    if point == "publish.before_refs":
        assert stages["shard"]["ran"] == 0


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
    crashed = run_prep("build", big, "--store", store, "--workers", "2", check=False,
                       env=prep_env(PREP_CRASH_AT=point), new_session=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (store / "refs" / "tiny" / "latest.json").exists()
    assert all_objects_intact(store)
    assert run_prep("build", big, "--store", store, "--workers", "2").stdout.split()[-1] == expected
    assert all_objects_intact(store)
    stages = _last_log(store)
    assert stages["tokenize"]["ran"] == 0
    if point == "shard.before_commit:2":
        assert stages["shard"]["ran"] == 1 and stages["shard"]["cached"] == 1
    else:
        assert stages["shard"]["ran"] + stages["shard"]["cached"] == 2
