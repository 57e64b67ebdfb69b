"""Keys under prep's prefixes that name nothing (a stray file under `snapshots/` or `holds/`)
and damaged read-back records: each is a finding of fsck and a clear refusal or a collection
by gc, never a traceback, and a damaged read-back record no longer blocks `prep tag` once
repaired."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prep.errors import IntegrityError
from prep.storage import LocalStore
from prep.store.fsck import fsck
from prep.store.gc import collect_garbage
from prep.store.layout import readback_key
from prep.store.snapshots import list_snapshot_ids, resolve
from tests.helpers import prep_env, run_prep
from tests.store.test_gc import project, template  # noqa: F401  (module fixtures)


def findings(store: LocalStore) -> list[tuple[str, str, str]]:
    return [(f.problem, f.kind, f.key) for f in fsck(store).findings]


def test_a_stray_key_under_snapshots_is_a_finding_and_gc_collects_it(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: `snapshots/<not hex>` stopped fsck and gc with a ValueError traceback, and made
    `prep show <prefix>` call a unique prefix ambiguous."""
    store = LocalStore(project["store"])
    snapshot = resolve(store, "tiny@latest")
    hexpart = snapshot.id.removeprefix("sha256:")
    for name in ("notes.txt", hexpart[:6]):
        store.put_bytes(f"snapshots/{name}", b"")
    assert findings(store) == [("invalid", "snapshot marker", f"snapshots/{name}")
                               for name in sorted(("notes.txt", hexpart[:6]))]
    assert list_snapshot_ids(store, hexpart[:4]) == [snapshot.id]
    assert resolve(store, hexpart[:6]).id == snapshot.id
    kept = collect_garbage(store, grace_seconds=0)
    assert kept.deleted["snapshots"].count == 2 and kept.deleted["objects"].count == 0
    assert fsck(store).clean and resolve(store, "tiny@latest").id == snapshot.id


def test_a_stray_key_under_holds_is_a_finding_and_gc_refuses_in_one_line(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: `holds/<not hex>.json` stopped fsck and gc with a ValueError traceback."""
    store = LocalStore(project["store"])
    store.put_bytes("holds/zz.json", b"junk")
    assert findings(store) == [("invalid", "hold", "holds/zz.json")]
    with pytest.raises(IntegrityError, match="holds/zz.json: not a hold record"):
        collect_garbage(store, grace_seconds=0)
    result = run_prep("gc", "--store", project["store"], "--grace", "0s", check=False)
    assert result.returncode == 3 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("prep: error: ")


def test_a_damaged_read_back_record_is_found_and_repaired(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: a garbled `readback/<hex>.json` made `prep tag` fail (exit 3) while fsck called
    the store clean, and no repair could remove it."""
    store = LocalStore(project["store"])
    snapshot = resolve(store, "tiny@latest")
    key = readback_key(snapshot.id)
    path = store.local_path(key)
    assert path is not None and path.exists()
    path.chmod(0o644)
    path.write_bytes(b"junk")
    store.put_bytes("readback/zz.json", b"junk")
    assert run_prep("tag", "tiny@latest", "audit", "--store", project["store"], check=False).returncode == 3
    assert findings(store) == [("invalid", "read-back record", key), ("invalid", "read-back record", "readback/zz.json")]
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and set(repaired.repair.records) == {key, "readback/zz.json"}
    assert fsck(store).clean
    run_prep("tag", "tiny@latest", "audit", "--store", project["store"])  # reads the snapshot back again
    assert store.exists(key) and fsck(store).clean


def test_an_empty_folder_at_a_task_record_key_is_a_finding_that_repair_removes(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: a folder in place of a task record made a build fail (one line) while fsck called
    the store clean: the local listing shows no key where a folder holds nothing. (No packs: a
    build would find the record in its pack and never read the key. A crash point armed before the
    order stage's commits, never reached, makes it commit a record a task.)"""
    store = LocalStore(project["store"])
    snapshot = resolve(store, "tiny@latest")
    shutil.rmtree(project["store"] / "packs")
    run_prep("build", project["v1"], "--store", project["store"], "--workers", "1",
             env=prep_env(PREP_CRASH_AT="order.before_commit:1000000"))
    shutil.rmtree(project["store"] / "packs")
    key = next(info.key for info in store.list("tasks/order/"))
    path = store.local_path(key)
    assert path is not None
    path.unlink()
    path.mkdir()
    failed = run_prep("build", project["v1"], "--store", project["store"], "--workers", "1", check=False)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr and key in failed.stderr
    assert findings(store) == [("invalid", "task record", key)]
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and repaired.repair.records == (key,) and not path.exists()
    rebuilt = run_prep("build", project["v1"], "--store", project["store"], "--workers", "1").stdout.split()[-1]
    assert rebuilt == snapshot.id and not path.is_dir() and fsck(store).clean  # the rebuild commits it in a pack


def test_empty_folders_at_a_ref_and_a_policy_are_findings_but_the_layouts_own_folders_are_not(
        project: dict[str, Path]) -> None:  # noqa: F811
    """An empty folder is a finding only where a key is read (a ref, a retention policy; scoped by
    dataset like them); an empty prefix folder (a stage's records all gone, an object fan-out
    folder) is the layout's own and holds no finding."""
    store = LocalStore(project["store"])
    ref_folder, policy_folder = "refs/tiny/audit.json", "retention/tiny/9999999999999999.json"
    for key in (ref_folder, policy_folder, "tasks/merge", "objects/sha256/zz", "refs/other/latest.json"):
        path = store.local_path(key)
        assert path is not None
        path.mkdir(parents=True)
    assert findings(store) == [("invalid", "ref", "refs/other/latest.json"), ("invalid", "ref", ref_folder),
                               ("invalid", "retention policy", policy_folder)]
    assert [(f.kind, f.key) for f in fsck(store, dataset="tiny").findings] == [("ref", ref_folder),
                                                                              ("retention policy", policy_folder)]
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and set(repaired.repair.records) == {
        ref_folder, policy_folder, "refs/other/latest.json"}
    assert fsck(store).clean and resolve(store, "tiny@latest").id
    assert (project["store"] / "tasks" / "merge").is_dir(), "a prefix folder is left alone"
