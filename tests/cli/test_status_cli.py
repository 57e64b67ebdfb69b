"""`prep status PIPELINE` through the real CLI: up to date after a build, the tokenize task and
stages that would run after an edit, --json validated against prep.status-report/1, no write to
the store (nor to a store path that does not exist yet), and a damaged task pack warned about."""

from __future__ import annotations

import json
from pathlib import Path

from prep.manifest.schema import validate
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.test_status import tree


def test_status_before_and_after_a_build_and_after_an_edit(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(12, seed=1, prefix="a"))
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(9, seed=2, prefix="b"))
    pipeline = write_pipeline(tmp_path, tokenizer_path)
    store = tmp_path / "store"
    fresh = run_prep("status", pipeline, "--store", store)
    assert "a build would run 2 of 2 tokenize tasks and 3 of 3 stages" in fresh.stdout and not store.exists()
    snapshot = run_prep("build", pipeline, "--store", store, "--workers", "1").stdout.split()[-1]
    before = tree(store)
    clean = run_prep("status", pipeline, "--store", store).stdout
    assert clean.startswith(f"status     tiny: up to date: a build would publish {snapshot} (tiny@latest) again\n")
    assert "inputs     0 changed, 0 added, 0 removed, 2 unchanged" in clean and "stage      shard     reused" in clean
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(10, seed=2, prefix="b"))
    edited = run_prep("status", pipeline, "--store", store).stdout
    assert "a build would run 1 of 2 tokenize tasks and 3 of 3 stages (tokenize, order, shard)" in edited
    assert "  ~ b.jsonl\n" in edited and "  would run  b.jsonl part 0\n" in edited and "a.jsonl part" not in edited
    report = json.loads(run_prep("status", pipeline, "--store", store, "--json").stdout)
    validate(report, "prep.status-report/1", "status --json")
    assert report["latest"] == snapshot and not report["up_to_date"]
    assert [(t["source"], t["committed"]) for t in report["tokenize_tasks"]] == [("a.jsonl", True), ("b.jsonl", False)]
    assert tree(store) == before  # status wrote nothing
    bad = run_prep("status", tmp_path / "missing.toml", "--json", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("prep: error: ")
    validate(json.loads(bad.stdout), "prep.error/1", "status --json failure")


def test_status_warns_of_an_unusable_task_pack_and_counts_its_tasks_as_a_build_would(tmp_path: Path,
                                                                                       tokenizer_path: Path) -> None:
    """A task pack damaged in the store (it may be its records' only copy): status says so on
    stderr, as a build does, and reports the task as one that would run; the build does run it,
    to the same snapshot."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(12, seed=1, prefix="a"))
    pipeline = write_pipeline(tmp_path, tokenizer_path)
    store = tmp_path / "store"
    snapshot = run_prep("build", pipeline, "--store", store, "--workers", "1").stdout.split()[-1]
    assert run_prep("status", pipeline, "--store", store).stderr == ""
    packs = sorted(store.glob("packs/tokenize/*/*.json"))
    assert len(packs) == 1
    packs[0].write_bytes(packs[0].read_bytes()[:-7] + b"garbage")
    damaged = run_prep("status", pipeline, "--store", store)
    assert "warning: an unusable task pack is ignored" in damaged.stderr and "does not hash to its name" in damaged.stderr
    assert "a build would run 1 of 1 tokenize task" in damaged.stdout
    rebuilt = run_prep("build", pipeline, "--store", store, "--workers", "1")
    assert rebuilt.stdout.split()[-1] == snapshot and "warning: an unusable task pack is ignored" in rebuilt.stderr
