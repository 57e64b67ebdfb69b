"""A history record deleted from the middle of a ref's history (issue 39): fsck names the ref and
the missing generation, and gc keeps the rollback target the next generation's `previous` still
names; when no record names a missing generation's snapshot, gc keeps every stored snapshot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prep.errors import NotFoundError
from prep.manifest.schema import validate
from prep.storage import LocalStore
from prep.store.fsck import fsck
from prep.store.gc import collect_garbage
from prep.store.layout import history_key
from prep.store.retention import Override, snapshot_exists
from prep.store.snapshots import resolve
from tests.helpers import run_prep
from tests.store.test_gc import HOUR, age
from tests.store.test_retention import GENERATIONS, history, store  # noqa: F401  (module fixtures)

History = tuple[Path, Path, list[str]]


def test_fsck_reports_a_history_record_missing_from_the_middle(store: LocalStore) -> None:  # noqa: F811
    key = history_key("tiny", "latest", 4)
    store.delete(key)
    with pytest.raises(NotFoundError, match="generation 4 of tiny@latest is not in the store's history"):
        resolve(store, "tiny@latest~1")
    report = fsck(store)
    validate(report.to_json(), "prep.fsck-report/1", "fsck report")
    assert [(f.problem, f.kind, f.key, f.by) for f in report.findings] == [
        ("missing", "history record", key, "tiny@latest")]
    assert "generation 4 of tiny@latest" in report.findings[0].detail
    assert "tiny@latest~1" in report.findings[0].detail
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and repaired.repair.unrepairable == (key,), "repair cannot rewrite history"
    assert fsck(store, dataset="tiny").findings == report.findings, "--dataset sees the gap too"


def test_the_current_generations_record_missing_is_no_gap(store: LocalStore) -> None:  # noqa: F811
    """A publish whose history write failed (a full disk) leaves the ref ahead of its history:
    documented, and the ref's next move records it; so not a finding."""
    store.delete(history_key("tiny", "latest", GENERATIONS))
    assert fsck(store).clean


def test_a_history_generations_marker_gone_with_its_manifest_left_is_no_finding(
        store: LocalStore, history: History) -> None:  # noqa: F811
    """What a gc interrupted between markers and objects leaves of a generation it collected."""
    store.delete(f"snapshots/{history[2][0].removeprefix('sha256:')}")
    assert fsck(store).clean


def test_gc_keeps_the_rollback_target_a_missing_history_record_named(
        store: LocalStore, history: History, tmp_path: Path) -> None:  # noqa: F811
    """keep_last 3 (recorded by the builds) keeps generations 3-5; with generation 4's record gone,
    gc collected its snapshot, which generation 5 still names as `previous`."""
    ids = history[2]
    store.delete(history_key("tiny", "latest", 4))
    age(store.root, 2 * HOUR)
    dry = collect_garbage(store, HOUR, dry_run=True)
    assert ids[3] in {kept.snapshot for kept in dry.rules if kept.rule == "keep_last"}
    collect_garbage(store, HOUR)
    assert [snapshot_exists(store, i) for i in ids] == [False, False, True, True, True]
    pulled = run_prep("pull", ids[3], tmp_path / "rollback", "--store", store.root, check=False, timeout=120)
    assert pulled.returncode == 0, pulled.stderr
    assert fsck(store).count("missing") == 1, "only the history record itself is missing"


def test_gc_keeps_every_snapshot_when_a_missing_generation_is_named_by_nothing(
        store: LocalStore, history: History) -> None:  # noqa: F811
    """Generations 3 and 4 gone: generation 5 names 4's snapshot, but nothing names 3's, so gc
    cannot tell which snapshot keep_last keeps: it keeps them all rather than guess."""
    ids = history[2]
    store.delete(history_key("tiny", "latest", 3))
    store.delete(history_key("tiny", "latest", 4))
    age(store.root, 2 * HOUR)
    report = collect_garbage(store, HOUR)
    validate(report.to_json(), "prep.gc-report/2", "gc report")
    assert report.deleted["snapshots"].count == 0
    assert all(snapshot_exists(store, i) for i in ids)
    assert any("tiny@latest~2" in kept.by and "every stored snapshot" in kept.by for kept in report.rules)
    collect_garbage(store, HOUR, policy=Override(keep_last=2))
    assert [snapshot_exists(store, i) for i in ids] == [False, False, False, True, True], \
        "outside the window a gap keeps nothing more"


def test_gc_keep_within_keeps_a_missing_generations_snapshot(store: LocalStore, history: History) -> None:  # noqa: F811
    """keep_within: the time of a missing generation is unknown, but not after the next one's."""
    ids = history[2]
    store.delete(history_key("tiny", "latest", 2))
    age(store.root, 2 * HOUR)
    collect_garbage(store, HOUR, policy=Override(1, HOUR))  # the refs moved minutes ago, the markers look 2 h old
    assert all(snapshot_exists(store, i) for i in ids)


def test_fsck_cli_names_the_gap(store: LocalStore) -> None:  # noqa: F811
    key = history_key("tiny", "latest", 2)
    store.delete(key)
    found = run_prep("fsck", "--store", store.root, "--json", check=False, timeout=120)
    assert found.returncode == 1, found.stderr
    report = json.loads(found.stdout)
    validate(report, "prep.fsck-report/1", "fsck report")
    assert [(f["problem"], f["kind"], f["key"]) for f in report["findings"]] == [("missing", "history record", key)]
    text = run_prep("fsck", "--store", store.root, "--repair", check=False, timeout=120)
    assert text.returncode == 1 and f"unrepairable {key}" in text.stdout and "Traceback" not in text.stderr


def test_fsck_reads_a_history_record_within_a_ref_values_bound(store: LocalStore) -> None:  # noqa: F811
    """A history record padded past what a ref value holds (valid JSON, 100 KiB of blanks) is read
    by no command within that bound, so fsck lists it as invalid instead of reading it whole."""
    key = history_key("tiny", "latest", 2)
    path = Path(store.root) / key
    path.write_bytes(path.read_bytes() + b" " * (100 << 10))
    report = fsck(store)
    assert [(f.problem, f.kind, f.key) for f in report.findings] == [("invalid", "history record", key)]
    assert "larger than 65536 bytes" in report.findings[0].detail
