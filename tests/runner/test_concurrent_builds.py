"""Builds meeting on one store, and builds crashed and rerun: nothing one does (checking, repairing,
committing, publishing) takes away what another relies on, and a rerun converges."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.errors import IntegrityError, StaleRefError
from prep.progress import Progress
from prep.runner.build import PublishOptions, build
from prep.runner.reuse import run_check_job
from prep.runner.tokenizing import run_tokenize_job
from prep.storage import LocalStore
from prep.store import cas
from prep.store.refs import read_ref
from tests.helpers import unpack, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, all_objects_intact, two_file_corpus
from tests.runner.test_reuse import flip_byte, object_path, task_outputs


class RacedExecutor(InProcessExecutor):
    """Runs tasks in this process; `after_check` hears the objects each check run found bad, and
    `before_task` each task function (unwrapped from the code check) before it runs."""

    def __init__(self, after_check: Callable[[list[str]], None], before_task: Callable[[Any], None]) -> None:
        self.after_check, self.before_task = after_check, before_task

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        inner = getattr(fn, "fn", fn)
        bad: list[str] = []
        for index, item in enumerate(items):
            self.before_task(inner)
            result = fn(item)
            if inner is run_check_job:
                bad.extend(result)
            yield index, result
        if inner is run_check_job:
            self.after_check(bad)


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return two_file_corpus(tmp_path, 40, 30)


def test_a_copy_repaired_by_another_build_is_not_deleted(corpus: Path, tokenizer_path: Path) -> None:
    """Regression: a build that found a reused intermediate corrupt deleted it before recomputing
    it, even when another build had repaired it since the check: the other build, which had read
    it back and published, was left without it while this one recomputed (for good, were this
    one killed then)."""
    store_dir = corpus / "store"
    store = LocalStore(store_dir)
    before = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB")
    build(load_pipeline(before), store, InProcessExecutor(), (), Progress(quiet=True))
    rotted = task_outputs(store_dir, "tokenize")[0]
    path = object_path(store_dir, rotted)
    good = path.read_bytes()
    flip_byte(path, 5)

    def repair(bad: list[str]) -> None:  # the other build's put: the corrupt copy replaced by the right bytes
        if rotted in bad:
            path.unlink()
            path.write_bytes(good)
            os.chmod(path, 0o444)

    intact_while_recomputing: list[bool] = []

    def note(fn: Any) -> None:
        if fn is run_tokenize_job:
            intact_while_recomputing.append(cas.check(store, rotted))

    changed = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="1KB")  # the shards read every part
    result = build(load_pipeline(changed), store, RacedExecutor(repair, note), (), Progress(quiet=True))
    assert intact_while_recomputing == [True]
    assert [entry["object"] for entry in json.loads((store_dir / result.log_key).read_text())["recomputed"]] == [rotted]
    assert all_objects_intact(store_dir)


def test_commit_records_broken_by_hand_stop_the_build_with_one_error(corpus: Path, tokenizer_path: Path) -> None:
    """Regression: a truncated stage record was reported as an unusable manifest "rebuilding it from
    its tasks", and then the build stopped on the same record (create-only: it cannot be rebuilt);
    a stage record naming another stage's manifest was trusted: for the order stage a traceback
    (KeyError), for the shard stage a snapshot published with the order manifest as its shard stage;
    a tokenize task record without the part's entries (schema-valid: layout 2) was a KeyError traceback."""
    store_dir = corpus / "store"
    pipeline = load_pipeline(write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB"))
    first = build(pipeline, LocalStore(store_dir), InProcessExecutor(), (), Progress(quiet=True))
    stage_records = {stage: next((store_dir / "stages" / stage).glob("*.json")) for stage in ("tokenize", "order", "shard")}
    bodies = {stage: json.loads(path.read_bytes()) for stage, path in stage_records.items()}
    for path in stage_records.values():
        path.chmod(0o644)
    stage_records["order"].write_bytes(stage_records["order"].read_bytes()[:20])
    said = io.StringIO()
    with pytest.raises(IntegrityError, match=f"{stage_records['order'].name}: unreadable commit record"):
        build(pipeline, LocalStore(store_dir), InProcessExecutor(), (), Progress(said))
    assert "rebuilding" not in said.getvalue()
    for stage, named in (("order", "tokenize"), ("shard", "order")):
        for each, path in stage_records.items():
            path.write_text(json.dumps({**bodies[each], "output": bodies[named]["output"]} if each == stage else bodies[each]))
        with pytest.raises(IntegrityError, match=f"{stage_records[stage].name}: names .*not the manifest of that {stage}"):
            build(pipeline, LocalStore(store_dir), InProcessExecutor(), (), Progress(quiet=True))
    for each, path in stage_records.items():
        path.write_text(json.dumps(bodies[each]))
    unpack(store_dir, "tokenize")  # as a layout-2 build left it: single records, no packs
    task = next((store_dir / "tasks" / "tokenize").glob("*.json"))
    task.chmod(0o644)
    earlier = json.loads(task.read_bytes())
    del earlier["outputs"]["entries"]  # as a layout-2 tokenize task recorded it
    task.write_text(json.dumps(earlier))
    with pytest.raises(IntegrityError, match=f"{task.name}: the task record names no part's entries"):
        build(pipeline, LocalStore(store_dir), InProcessExecutor(), (), Progress(quiet=True))
    latest = read_ref(LocalStore(store_dir), "tiny", "latest")
    assert latest is not None and (latest.snapshot, latest.generation) == (first.snapshot.id, 1)


def test_a_rerun_with_the_same_expect_after_latest_moved_is_up_to_date(corpus: Path, tokenizer_path: Path) -> None:
    """Regression: a build given `--expect 0` that was killed once it had moved `latest` (before
    its log, or before a tag) could not be rerun as it was: the rerun refused the expectation
    before building (exit 2, "nothing built"), though `latest` named the very snapshot it makes.
    Another snapshot at `latest` is still refused before anything is built."""
    store = LocalStore(corpus / "store")
    pipeline = load_pipeline(write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB"))
    killed = build(pipeline, store, InProcessExecutor(), (), Progress(quiet=True), PublishOptions(expect=0))
    rerun = build(pipeline, store, InProcessExecutor(), ("v1",), Progress(quiet=True), PublishOptions(expect=0))
    assert rerun.snapshot.id == killed.snapshot.id
    assert [(o.name, o.action, o.generation) for o in rerun.refs] == [("latest", "unchanged", 1), ("v1", "moved", 1)]
    reseeded = load_pipeline(write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB", seed=7))
    with pytest.raises(StaleRefError, match="generation 1 .*not absent as expected; left unmoved; nothing built"):
        build(reseeded, store, InProcessExecutor(), (), Progress(quiet=True), PublishOptions(expect=0))
