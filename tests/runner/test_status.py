"""`prep status` below the CLI: after a build everything is reused with the keys the build
recorded; after an input edit exactly that file's tokenize tasks and every later stage would run;
a missing stage record makes that stage and those after it run; and status never writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

from prep.config import load_pipeline
from prep.history.documents import stage_manifest
from prep.runner.status import REUSED, WOULD_RUN, build_status
from prep.storage import LocalStore
from prep.store.layout import stage_record_key
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.neardup.nearstatsupport import write_sized_corpus
from tests.runner.buildsupport import build_local


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root`: its SHA-256 and mtime, to prove nothing was written."""
    if not root.exists():
        return {}
    return {str(path.relative_to(root)): (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
            for path in sorted(root.rglob("*")) if path.is_file()}


def _no_warning(line: str) -> None:
    raise AssertionError(f"status warned: {line}")


def _setup(root: Path, tokenizer: Path) -> Path:
    write_jsonl(root / "corpus" / "a.jsonl", make_records(30, seed=1, prefix="a"))
    write_jsonl(root / "corpus" / "b.jsonl", make_records(20, seed=2, prefix="b"))
    return write_pipeline(root, tokenizer, ["corpus/*.jsonl"])


def test_after_a_build_everything_is_reused_with_the_recorded_keys(tmp_path: Path, tokenizer_path: Path) -> None:
    pipeline = _setup(tmp_path, tokenizer_path)
    built = build_local(pipeline, tmp_path / "store").snapshot
    store = LocalStore(tmp_path / "store")
    assert not list(store.list("tasks/tokenize/")), "the build committed its tasks in packs only"
    before = tree(store.root)
    status = build_status(load_pipeline(pipeline), store, _no_warning)
    assert tree(store.root) == before
    assert status.up_to_date and status.latest is not None and status.latest.id == built.id
    assert [(s.name, s.state) for s in status.stages] == [(n, REUSED) for n in ("tokenize", "order", "shard")]
    assert [s.key for s in status.stages] == [s["key"] for s in built.manifest["stages"]]
    recorded = [task["key"] for task in stage_manifest(store, built, "tokenize")["tasks"]]
    assert [part.key for part in status.parts] == recorded and all(part.committed for part in status.parts)
    assert {entry.change for entry in status.inputs} == {"unchanged"}
    assert status.version == built.manifest["inputs"]["version"]


def test_an_edited_input_names_its_tokenize_tasks_and_the_stages_that_would_run(tmp_path: Path,
                                                                                  tokenizer_path: Path) -> None:
    pipeline = _setup(tmp_path, tokenizer_path)
    build_local(pipeline, tmp_path / "store")
    store = LocalStore(tmp_path / "store")
    write_jsonl(tmp_path / "corpus" / "b.jsonl", [*make_records(20, seed=2, prefix="b"), {"id": "new", "text": "added"}])
    write_jsonl(tmp_path / "corpus" / "c.jsonl", make_records(3, seed=3, prefix="c"))
    before = tree(store.root)
    status = build_status(load_pipeline(pipeline), store, _no_warning)
    assert tree(store.root) == before
    assert {(e.path, e.change) for e in status.inputs} == {("a.jsonl", "unchanged"), ("b.jsonl", "changed"),
                                                           ("c.jsonl", "added")}
    assert {(p.source, p.committed) for p in status.parts} == {("a.jsonl", True), ("b.jsonl", False), ("c.jsonl", False)}
    assert not status.up_to_date
    assert [(s.name, s.state, s.key) for s in status.stages] == [(n, WOULD_RUN, None) for n in
                                                                 ("tokenize", "order", "shard")]
    assert status.stages[0].reason == f"2 of {len(status.parts)} tokenize tasks would run first"
    rebuilt = build_local(pipeline, tmp_path / "store").snapshot
    again = build_status(load_pipeline(pipeline), store, _no_warning)
    assert again.up_to_date and [s.key for s in again.stages] == [s["key"] for s in rebuilt.manifest["stages"]]
    assert {p.key for p in status.parts} == {p.key for p in again.parts}  # the keys status named were the ones built


def test_a_missing_stage_record_runs_that_stage_and_every_later_one(tmp_path: Path, tokenizer_path: Path) -> None:
    pipeline = _setup(tmp_path, tokenizer_path)
    built = build_local(pipeline, tmp_path / "store").snapshot
    store = LocalStore(tmp_path / "store")
    order_key = next(s["key"] for s in built.manifest["stages"] if s["name"] == "order")
    (store.root / stage_record_key("order", order_key)).unlink()
    status = build_status(load_pipeline(pipeline), store, _no_warning)
    assert [(s.name, s.state) for s in status.stages] == [("tokenize", REUSED), ("order", WOULD_RUN),
                                                           ("shard", WOULD_RUN)]
    assert status.stages[1].key == order_key and status.stages[2].key is None and not status.up_to_date


def test_near_dup_stages_are_keyed_as_the_build_keys_them(tmp_path: Path, tokenizer_path: Path) -> None:
    """[dedup.near] (with verify, whose bucket table also names the intermediates): status lists
    the bucket and cluster stages with the snapshot's keys; without the cluster stage's record
    that stage would run, without the bucket stage's both would, and order and shard (which read
    the tokenize output) stay reused. (Status listed no near stage.)"""
    write_sized_corpus(tmp_path, tokenizer_path, verify=True)
    built = build_local(tmp_path / "pipeline.toml", tmp_path / "store").snapshot
    store = LocalStore(tmp_path / "store")
    status = build_status(load_pipeline(tmp_path / "pipeline.toml"), store, _no_warning)
    assert [(s.name, s.key) for s in status.stages] == [(s["name"], s["key"]) for s in built.manifest["stages"]]
    assert status.up_to_date and all(s.state == REUSED for s in status.stages)
    keys = {s.name: s.key for s in status.stages}
    for stage, running in (("near_clusters", ["near_clusters"]), ("near_buckets", ["near_buckets", "near_clusters"])):
        (store.root / stage_record_key(stage, str(keys[stage]))).unlink()
        status = build_status(load_pipeline(tmp_path / "pipeline.toml"), store, _no_warning)
        assert [s.name for s in status.stages if s.state == WOULD_RUN] == running and not status.up_to_date


def test_status_of_a_store_never_built_creates_nothing(tmp_path: Path, tokenizer_path: Path) -> None:
    pipeline = _setup(tmp_path, tokenizer_path)
    status = build_status(load_pipeline(pipeline), LocalStore(tmp_path / "absent"), _no_warning)
    assert not (tmp_path / "absent").exists()
    assert status.latest is None and not any(p.committed for p in status.parts)
    assert {e.change for e in status.inputs} == {"added"} and status.stages[0].state == WOULD_RUN
