"""fsck blind spots of issue 39: the deleted marker of a snapshot a ref names (found, and restored
from its manifest by --repair), and what --repair leaves in place (refs, history, holds,
policies), which it lists as unrepairable instead of `[]`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prep.errors import NotFoundError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.storage import LocalStore
from prep.store.fsck import fsck
from prep.store.holds import place_hold
from prep.store.layout import history_key, hold_key, ref_key, snapshot_marker_key
from prep.store.snapshots import resolve
from tests.helpers import run_prep
from tests.store.test_fsck import flip
from tests.store.test_gc import project, template  # noqa: F401  (module fixtures)


def _marker_gone(project: dict[str, Path]) -> tuple[LocalStore, str, str]:  # noqa: F811
    """tiny@latest's snapshot marker deleted: (store, snapshot id, marker key)."""
    store = LocalStore(project["store"])
    snapshot_id = resolve(store, "tiny@latest").id
    key = snapshot_marker_key(snapshot_id)
    store.delete(key)
    return store, snapshot_id, key


def test_a_deleted_marker_of_the_latest_snapshot_is_found_and_restored(project: dict[str, Path]) -> None:  # noqa: F811
    store, snapshot_id, key = _marker_gone(project)
    prefix = snapshot_id.removeprefix("sha256:")[:12]
    with pytest.raises(NotFoundError, match=f"no snapshot id starts with {prefix}"):
        resolve(store, prefix)
    report = fsck(store)
    validate(report.to_json(), "prep.fsck-report/1", "fsck report")
    assert [(f.problem, f.kind, f.key, f.by) for f in report.findings] == [
        ("missing", "snapshot marker", key, "tiny@latest")]
    assert snapshot_id in report.findings[0].detail
    repaired = fsck(store, repair=True)
    validate(repaired.to_json(), "prep.fsck-report/1", "fsck report")
    assert repaired.repair is not None and repaired.repair.restored == (key,) and not repaired.repair.unrepairable
    assert repaired.to_json()["repair"]["restored"] == [key]
    assert store.exists(key) and store.get_bytes(key) == b""
    assert resolve(store, prefix).id == snapshot_id
    assert fsck(store).clean


def test_a_marker_is_not_restored_from_a_corrupt_manifest(project: dict[str, Path]) -> None:  # noqa: F811
    store, snapshot_id, key = _marker_gone(project)
    flip(store, snapshot_id, offset=10)
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and not repaired.repair.restored and not store.exists(key)
    assert [f.kind for f in repaired.findings] == ["snapshot manifest"], "its manifest is what is damaged"


def test_fsck_cli_repairs_a_deleted_marker(project: dict[str, Path]) -> None:  # noqa: F811
    store, snapshot_id, key = _marker_gone(project)
    found = run_prep("fsck", "--store", project["store"], check=False, timeout=120)
    assert found.returncode == 1 and f"snapshot marker  {key}  (reached from tiny@latest)" in found.stdout
    repaired = run_prep("fsck", "--store", project["store"], "--repair", "--json", check=False, timeout=120)
    report = json.loads(repaired.stdout)
    validate(report, "prep.fsck-report/1", "fsck report")
    assert report["repair"]["restored"] == [key] and report["repair"]["unrepairable"] == []
    shown = run_prep("show", snapshot_id.removeprefix("sha256:")[:12], "--store", project["store"], timeout=120)
    assert snapshot_id in shown.stdout


def _overwrite(store: LocalStore, key: str, body: bytes) -> None:
    path = store.local_path(key)
    assert path is not None
    if path.exists():
        path.chmod(0o644)
    path.write_bytes(body)


def _bad_ref(store: LocalStore) -> str:
    key = ref_key("tiny", "latest")
    _overwrite(store, key, store.get_bytes(key)[:-9])
    return key


def _bad_history(store: LocalStore) -> str:
    key = history_key("tiny", "latest", 1)
    _overwrite(store, key, b"junk")
    return key


def _foreign_ref(store: LocalStore) -> str:
    body = canonical.loads(store.get_bytes(ref_key("tiny", "latest")))
    store.put_bytes(ref_key("other", "latest"), canonical.dumps({**body, "dataset": "other"}))
    return ref_key("other", "latest")


def _bad_hold(store: LocalStore) -> str:
    snapshot = resolve(store, "tiny@latest")
    place_hold(store, snapshot, "audit")
    _overwrite(store, hold_key(snapshot.id), b"junk")
    return hold_key(snapshot.id)


def _bad_policy(store: LocalStore) -> str:
    key = max(info.key for info in store.list("retention/tiny/"))
    _overwrite(store, key, b"junk")
    return key


LEFT = {"ref": (_bad_ref, "ref"), "history record": (_bad_history, "history record"),
        "foreign ref": (_foreign_ref, "ref"), "hold": (_bad_hold, "hold"),
        "retention policy": (_bad_policy, "retention policy")}


@pytest.mark.parametrize("damage", sorted(LEFT))
def test_repair_lists_what_it_leaves_as_unrepairable(project: dict[str, Path], damage: str) -> None:  # noqa: F811
    """Regression: --repair reported `"unrepairable": []` for invalid refs and history records (and
    holds and policies) it never deletes, where docs/history.md says it lists them."""
    store = LocalStore(project["store"])
    harm, kind = LEFT[damage]
    key = harm(store)
    body = store.get_bytes(key)
    repaired = fsck(store, repair=True)
    validate(repaired.to_json(), "prep.fsck-report/1", "fsck report")
    assert [(f.problem, f.kind, f.key) for f in repaired.findings] == [("invalid", kind, key)]
    assert repaired.repair is not None and repaired.repair.unrepairable == (key,)
    assert store.get_bytes(key) == body, f"repair never deletes a {kind}"


def test_fsck_cli_says_why_each_unrepairable_key_is_left(project: dict[str, Path]) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    key = _bad_history(store)
    ran = run_prep("fsck", "--store", project["store"], "--repair", check=False, timeout=120)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr
    line = next(line for line in ran.stdout.splitlines() if "unrepairable" in line and key in line)
    assert "a ref names it" not in line and "history" in line, line
    report = json.loads(run_prep("fsck", "--store", project["store"], "--repair", "--json", check=False,
                                 timeout=120).stdout)
    validate(report, "prep.fsck-report/1", "fsck report")
    assert report["repair"]["unrepairable"] == [key]
