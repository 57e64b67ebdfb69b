"""[checks] through the real CLI (issue 43): a build whose measures break a check publishes nothing
(exit 2 naming each failed check and its measured value; no ref, tag or history entry moves; no
snapshot manifest is stored) and keeps what it built, so a rerun with only [checks] changed runs no
task; a bad [checks] key stops the build before any task. And the distributions the manifest
records match the shards read back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from prep.manifest.schema import validate
from prep.quality.lengths import TokenLengths, measure
from prep.storage import LocalStore
from prep.store.refs import read_ref, ref_history
from prep.store.snapshots import list_snapshot_ids, load_snapshot
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import read_sequences

BAD_LINES = 10


def skipping_project(root: Path, tokenizer: Path, checks: str) -> Path:
    """40 good records and BAD_LINES lines that are no JSON, read with on_error = "skip": a skip rate of 0.2."""
    write_jsonl(root / "corpus" / "a.jsonl", make_records(40, seed=3, prefix="a"))
    with open(root / "corpus" / "a.jsonl", "a", encoding="utf-8") as out:
        out.write("".join(f"{{not json {i}\n" for i in range(BAD_LINES)))
    return write_pipeline(root, tokenizer, extra_input='on_error = "skip"\n', extra=checks)


def build(pipeline: Path, store: Path, *extra: str) -> Any:
    return run_prep("build", pipeline, "--store", store, "--workers", "1", "--json", *extra, check=False)


def stage_counts(report: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {stage["name"]: (stage["ran"], stage["cached"]) for stage in report["stages"]}


def test_a_skip_rate_over_the_limit_publishes_nothing_and_a_loosened_rerun_reuses_every_task(
        tmp_path: Path, tokenizer_path: Path) -> None:
    store = tmp_path / "store"
    pipeline = skipping_project(tmp_path, tokenizer_path, "\n[checks]\nmax_skipped_fraction = 0.1\nmin_documents = 1\n")
    failed = build(pipeline, store, "--tag", "v1")
    assert failed.returncode == 2
    line = ("checks.max_skipped_fraction = 0.1: measured 0.2 (10 of 50), above the maximum")
    assert failed.stderr.count("prep: error: ") == 1 and line in failed.stderr.splitlines()[-1]
    assert "1 of 2 [checks] failed, nothing published" in failed.stderr
    error = json.loads(failed.stdout)
    validate(error, "prep.error/1")
    assert error["kind"] == "checks_failed" and line in error["error"]
    local = LocalStore(store)
    assert read_ref(local, "tiny", "latest") is None and read_ref(local, "tiny", "v1") is None
    assert ref_history(local, "tiny") == [] and list_snapshot_ids(local) == []
    shown = run_prep("show", "tiny@latest", "--store", store, check=False)
    assert shown.returncode == 2 and "prep: error:" in shown.stderr

    pipeline.write_text(pipeline.read_text().replace("max_skipped_fraction = 0.1", "max_skipped_fraction = 0.2"))
    passed = build(pipeline, store, "--tag", "v1")
    assert passed.returncode == 0, passed.stderr
    report = json.loads(passed.stdout)
    validate(report, "prep.build-report/1")
    assert all(ran == 0 and cached > 0 for ran, cached in stage_counts(report).values()), stage_counts(report)
    assert report["checks"] == [
        {"name": "max_skipped_fraction", "limit": "0.2", "measured": "0.2", "count": BAD_LINES, "of": 50, "passed": True},
        {"name": "min_documents", "limit": 1, "measured": 40, "passed": True}]
    snapshot = load_snapshot(local, report["snapshot"])
    assert snapshot.manifest["checks"] == report["checks"]
    latest, tag = read_ref(local, "tiny", "latest"), read_ref(local, "tiny", "v1")
    assert latest is not None and tag is not None and latest.snapshot == tag.snapshot == report["snapshot"]
    summary = run_prep("show", "tiny@latest", "--store", store).stdout.splitlines()
    assert [line for line in summary if line.startswith("checks ")] == [
        f"checks     max_skipped_fraction = 0.2: measured 0.2 ({BAD_LINES} of 50), passed",
        "checks     min_documents = 1: measured 40, passed"]


def test_min_documents_unmet_leaves_the_published_snapshot_where_it_is(tmp_path: Path, tokenizer_path: Path) -> None:
    store = tmp_path / "store"
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=5, prefix="a"))
    first = build(write_pipeline(tmp_path, tokenizer_path), store)
    assert first.returncode == 0, first.stderr
    published = json.loads(first.stdout)["snapshot"]
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(5, seed=6, prefix="b"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, extra="\n[checks]\nmin_documents = 1000\n")
    failed = build(pipeline, store)
    assert failed.returncode == 2
    assert "checks.min_documents = 1000: measured 35, below the minimum" in failed.stderr
    local = LocalStore(store)
    latest = read_ref(local, "tiny", "latest")
    assert latest is not None and (latest.snapshot, latest.generation) == (published, 1)
    assert len(ref_history(local, "tiny")) == 1 and list_snapshot_ids(local) == [published]
    shown = run_prep("show", "tiny@latest", "--store", store, "--json")
    assert json.loads(shown.stdout)["stats"]["documents_written"] == 30 and "checks" not in json.loads(shown.stdout)


def test_a_bad_checks_key_stops_the_build_before_any_task(tmp_path: Path, tokenizer_path: Path) -> None:
    store = tmp_path / "store"
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(10, seed=7))
    steps = '\n[[steps]]\nuse = "length"\nmin_words = 2\n'
    for checks, message in (
            ("min_document = 3", "checks.min_document: unknown key"),
            ("max_dropped_fraction.language = 0.5", "checks.max_dropped_fraction.language: names no step "
                                                    "(the [[steps]] are: 1 (length))"),
            ('max_duplicate_fraction = "30%"', "checks.max_duplicate_fraction: expected a fraction from 0 to 1")):
        pipeline = write_pipeline(tmp_path, tokenizer_path, extra=f"{steps}\n[checks]\n{checks}\n")
        failed = build(pipeline, store)
        assert failed.returncode == 2
        assert failed.stderr == f"prep: error: {pipeline}: {message}" + failed.stderr.split(message, 1)[1]
        assert failed.stderr.count("\n") == 1 and json.loads(failed.stdout)["kind"] == "config"
        assert not (store / "tasks").exists()


def test_the_recorded_distributions_are_those_of_the_shards_read_back(tmp_path: Path, tokenizer_path: Path) -> None:
    """The histogram and median from the .bin/.idx sequences; per file, b.jsonl's repeats of a.jsonl
    counted as its duplicates, a step's drops as its own, and every column summing to the totals."""
    records = make_records(60, seed=8, prefix="a")
    records += [{"id": f"short-{i}", "text": "alpha " * (i % 4)} for i in range(12)]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", records)
    repeated = [record for record in records[:60] if len(record["text"].split()) <= 40][:7]  # the step keeps them
    write_jsonl(tmp_path / "corpus" / "b.jsonl", [{**record, "id": f"b-{i}"} for i, record in enumerate(repeated)]
                + make_records(20, seed=9, prefix="b2"))
    store = tmp_path / "store"
    pipeline = write_pipeline(tmp_path, tokenizer_path, formats='["bin"]', shard_size="2KB",
                              extra='\n[[steps]]\nuse = "length"\nmax_words = 50\n'
                                    '\n[checks]\nmax_dropped_fraction.1 = 1\nmin_tokens_per_doc_p50 = 1\n')
    ran = build(pipeline, store)
    assert ran.returncode == 0, ran.stderr
    manifest = load_snapshot(LocalStore(store), json.loads(ran.stdout)["snapshot"]).manifest
    validate(manifest, "prep.snapshot/1")
    stats = manifest["stats"]
    lengths = np.array([len(sequence) - 1 for sequence in read_sequences(store, manifest)])  # less the EOS
    expected: TokenLengths = measure(lengths)
    recorded = stats["tokens_per_document"]
    assert [(o["min"], o["max"], o["documents"]) for o in recorded["histogram"]] == expected.histogram()
    median = int(np.sort(lengths)[(len(lengths) + 1) // 2 - 1])
    assert recorded["median"] == {"min": median, "max": median}
    assert (recorded["empty"], recorded["short"]) == (int((lengths == 0).sum()), int((lengths < 16).sum()))
    a, b = stats["files"]
    assert (a["path"], b["path"]) == ("a.jsonl", "b.jsonl") and b["duplicates_dropped"] == 7
    assert a["dropped_by_steps"][0] > 0 and a["dropped_by_steps"][0] + b["dropped_by_steps"][0] == stats["steps"][0]["dropped"]
    for name in ("documents_read", "duplicates_dropped", "documents_written", "tokens_written"):
        assert a[name] + b[name] == stats[name], name
    for entry in (a, b):
        assert entry["documents_read"] == entry["duplicates_dropped"] + entry["documents_written"]
    assert [check["name"] for check in manifest["checks"]] == ["min_tokens_per_doc_p50", "max_dropped_fraction.1"]
    assert manifest["checks"][0]["measured"] == median and manifest["checks"][1]["step"] == 1
