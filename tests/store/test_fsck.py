"""fsck on real builds damaged by hand: a flipped byte in a shard, an intermediate or a stage
manifest, a deleted object, a record naming a missing object; each found with its kind and what
reaches it, each repaired so that a rebuild gives a clean fsck and the clean build's snapshot id.
Also on S3 (moto), with parallel hashing, and what repair must never touch."""

from __future__ import annotations

import io
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prep import hashing
from prep.errors import NotFoundError, StoreError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.storage import LocalStore
from prep.storage.backend import Store
from prep.store import cas, records
from prep.store.fsck import fsck
from prep.store.holds import place_hold
from prep.store.layout import PACKS_PREFIX, hold_key, object_key, task_record_key
from prep.store.leases import BUILD, Lease
from prep.store.snapshots import Snapshot, resolve
from tests.helpers import prep_env, run_prep, write_pipeline
from tests.runner.test_rebuild import user_step_project
from tests.s3support import admin_client
from tests.store.layout1 import plant_layout1
from tests.store.test_gc import EMPTY_TOKENIZE, copy_to_s3, project, template  # noqa: F401  (module fixtures)
from tests.store.test_packs import corrupt


def flip(store: LocalStore, object_id: str, offset: int | None = None) -> None:
    """Flip one bit of a stored object in place (objects are stored read-only)."""
    path = store.local_path(object_key(hashing.parse_id(object_id)))
    assert path is not None
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def stage_output(store: Store, snapshot: Snapshot, stage: str) -> str:
    return next(str(s["output"]) for s in snapshot.manifest["stages"] if s["name"] == stage)


def first_intermediate(store: Store, snapshot: Snapshot) -> str:
    manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, stage_output(store, snapshot, "tokenize")))
    return str(manifest["tasks"][0]["output"])


def _shard(store: LocalStore, snapshot: Snapshot) -> str:
    flip(store, "sha256:" + snapshot.artifacts[0]["sha256"])
    return f"artifact {snapshot.artifacts[0]['path']}"


def _intermediate(store: LocalStore, snapshot: Snapshot) -> str:
    flip(store, first_intermediate(store, snapshot))
    return "intermediate (tokenize output)"


def _part_entries(store: LocalStore, snapshot: Snapshot) -> str:
    manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, stage_output(store, snapshot, "tokenize")))
    flip(store, manifest["tasks"][-1]["entries"])
    return "part entries (tokenize output)"


def _stage_manifest(store: LocalStore, snapshot: Snapshot) -> str:
    flip(store, stage_output(store, snapshot, "order"), offset=3)
    return "stage manifest (order)"


def _deleted(store: LocalStore, snapshot: Snapshot) -> str:
    artifact = snapshot.artifacts[-1]
    store.delete(object_key(artifact["sha256"]))
    return f"artifact {artifact['path']}"


def _record_naming_missing(store: LocalStore, snapshot: Snapshot) -> str:
    records.write_task_record(store, "tokenize", "d" * 64, {"intermediate": "sha256:" + "9" * 64}, EMPTY_TOKENIZE)
    return "intermediate (output of task tokenize)"


DAMAGE: dict[str, tuple[Callable[[LocalStore, Snapshot], str], str]] = {
    "shard": (_shard, "corrupt"), "intermediate": (_intermediate, "corrupt"), "part entries": (_part_entries, "corrupt"),
    "stage manifest": (_stage_manifest, "corrupt"), "deleted object": (_deleted, "missing"),
    "record naming a missing object": (_record_naming_missing, "missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_fsck_finds_damage_and_repair_then_rebuild_restores_the_clean_snapshot(
        project: dict[str, Path], damage: str) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    clean = resolve(store, "tiny@latest")
    assert fsck(store).clean
    harm, problem = DAMAGE[damage]
    kind = harm(store, clean)

    report = fsck(store, jobs=3)
    validate(report.to_json(), "prep.fsck-report/1", "fsck report")
    assert [(f.problem, f.kind) for f in report.findings] == [(problem, kind)], report.findings
    assert "tiny@latest" in report.findings[0].by or report.findings[0].by.startswith("tasks/")
    assert fsck(store, jobs=1).findings == report.findings, "the same findings however many jobs hash"

    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and repaired.repair.records and not repaired.repair.unrepairable
    assert all(not store.exists(key) for key in (*repaired.repair.records, *repaired.repair.objects))
    rebuilt = run_prep("build", project["v1"], "--store", project["store"], "--workers", "1").stdout.split()[-1]
    assert rebuilt == clean.id
    after = fsck(store)
    assert after.clean, after.findings
    assert all(cas.check(store, f"sha256:{a['sha256']}") for a in resolve(store, "tiny@latest").artifacts)


def test_a_corrupt_snapshot_manifest_a_ref_names_is_reported_never_deleted(project: dict[str, Path]) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    snapshot = resolve(store, "tiny@latest")
    flip(store, snapshot.id, offset=10)
    report = fsck(store, repair=True)
    assert ("corrupt", "snapshot manifest") in [(f.problem, f.kind) for f in report.findings]
    assert report.repair is not None and report.repair.unrepairable == (object_key(hashing.parse_id(snapshot.id)),)
    assert store.exists(object_key(hashing.parse_id(snapshot.id))) and store.exists("refs/tiny/latest.json")


def test_invalid_records_and_dangling_objects(project: dict[str, Path]) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    orphan = cas.put_bytes(store, b"an object nothing names")
    assert [d.key for d in fsck(store).dangling] == [object_key(orphan.sha256)]
    assert fsck(store).clean, "dangling objects are gc's business, not damage"
    key = task_record_key("tokenize", "a" * 64)
    store.put_bytes(key, b'{"schema": "prep.task/9"}')
    report = fsck(store)
    assert [(f.problem, f.kind, f.key) for f in report.findings] == [("invalid", "task record", key)]
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and repaired.repair.records == (key,) and not store.exists(key)
    assert fsck(store).clean


@pytest.mark.parametrize("damage", ["flipped byte", "record missing", "record conflicting"])
def test_a_damaged_pack_is_an_invalid_finding_that_repair_deletes(project: dict[str, Path], damage: str) -> None:  # noqa: F811
    """A pack is a commit of its records (the driver commits in groups): one that does not read is
    a damaged commit, and one holding a record that another copy (a single record) contradicts is
    invalid with that copy; a pack whose records have no single record is sound. Repair deletes
    what is invalid (a build would ignore it and run its tasks again) and a rebuild gives the clean
    snapshot and a clean fsck."""
    store = LocalStore(project["store"])
    clean = resolve(store, "tiny@latest")
    key = min(info.key for info in store.list(PACKS_PREFIX) if info.key.startswith(f"{PACKS_PREFIX}tokenize/"))
    body = canonical.loads(store.get_bytes(key))
    victim = min(body["records"])
    assert not list(store.list("tasks/tokenize/")), "tokenize tasks are committed by packs only"
    if damage == "flipped byte":
        corrupt(store, key, damage)
    elif damage == "record conflicting":
        other = body["records"][max(body["records"])]["outputs"]
        records.write_task_record(store, "tokenize", victim, other, body["records"][victim]["summary"])
    report = fsck(store)
    validate(report.to_json(), "prep.fsck-report/1", "fsck report")
    if damage == "record missing":
        assert report.clean, report.findings
        return
    invalid = [key] + ([task_record_key("tokenize", victim)] if damage == "record conflicting" else [])
    assert sorted((f.problem, f.kind, f.key) for f in report.findings) == sorted(
        ("invalid", "task pack" if found == key else "task record", found) for found in invalid), report.findings
    assert ("damaged commit" if damage == "flipped byte" else "determinism bug") in report.findings[0].detail
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and repaired.repair.records == tuple(sorted(invalid))
    assert not any(store.exists(found) for found in invalid)
    assert fsck(store).clean
    assert run_prep("build", project["v1"], "--store", project["store"]).stdout.split()[-1] == clean.id
    assert fsck(store).clean


def test_repair_waits_for_no_build_and_check_needs_a_store(project: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    _shard(store, resolve(store, "tiny@latest"))
    with Lease(store, BUILD), pytest.raises(StoreError, match="a build holds lease"):
        fsck(store, repair=True)
    assert len(fsck(store).findings) == 1, "nothing was repaired while the build ran"
    with pytest.raises(StoreError, match="not a prep store"):
        fsck(LocalStore(tmp_path / "empty"))
    with pytest.raises(NotFoundError, match="no dataset 'other'"):
        fsck(store, dataset="other")


def test_dataset_scope_and_progress(project: dict[str, Path], tokenizer_path: Path) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    other = write_pipeline(project["v1"].parent, tokenizer_path, dataset="other", shard_size="5KB", name="other.toml")
    run_prep("build", other, "--store", project["store"], "--workers", "1")
    snapshot = resolve(store, "other@latest")
    flip(store, "sha256:" + snapshot.artifacts[-1]["sha256"])
    assert fsck(store, dataset="tiny").clean, "another dataset's damage is not this dataset's"
    stream = io.StringIO()
    report = fsck(store, dataset="other", progress=Progress(stream))
    assert [f.kind for f in report.findings] == [f"artifact {snapshot.artifacts[-1]['path']}"]
    assert report.dangling == () and "fsck: done" in stream.getvalue()


def test_fsck_on_s3_finds_a_corrupted_object(template: dict[str, Path], s3_bucket: str) -> None:  # noqa: F811
    store, snapshot = copy_to_s3(template["store"], s3_bucket)
    assert fsck(store).clean
    intermediate = first_intermediate(store, snapshot)
    key = object_key(hashing.parse_id(intermediate))
    data = bytearray(LocalStore(template["store"]).get_bytes(key))
    data[7] ^= 0x80
    admin_client().put_object(Bucket=s3_bucket.removeprefix("s3://").split("/", 1)[0], Key=key, Body=bytes(data))
    report = fsck(store, jobs=4)
    kind = "intermediate (tokenize output)"
    assert [(f.problem, f.kind, f.key) for f in report.findings] == [("corrupt", kind, key)]
    assert "tiny@latest" in report.findings[0].by


def test_a_repair_killed_between_records_and_objects_is_finished_by_the_next(project: dict[str, Path]) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    clean = resolve(store, "tiny@latest")
    _intermediate(store, clean)
    killed = run_prep("fsck", "--repair", "--store", project["store"], check=False, new_session=True,
                      env=prep_env(PREP_CRASH_AT="fsck.after_records"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = fsck(store)
    assert [(f.problem, f.kind) for f in left.findings] == [("corrupt", "intermediate (tokenize output)")], \
        "records went first: the corrupt object is still found, through the snapshot"
    named = [info.key for info in store.list(records.TASKS_PREFIX)
             if first_intermediate(store, clean) in store.get_bytes(info.key).decode()]
    assert named == [], "the kill came after the records naming the corrupt object were deleted"
    again = fsck(store, repair=True)
    assert again.repair is not None and again.repair.objects
    assert run_prep("build", project["v1"], "--store", project["store"], "--workers", "1").stdout.split()[-1] == clean.id
    assert fsck(store).clean


def _damaged(store: LocalStore, key: str, body: bytes, kind: str, detail: str) -> Path:
    """Overwrite the record at `key` with `body`; fsck must report it, alone, as invalid `kind`,
    and a repair must leave it where it is. Returns its path."""
    path = store.local_path(key)
    assert path is not None
    path.chmod(0o644)
    path.write_bytes(body)
    report = fsck(store)
    assert [(f.problem, f.kind, f.key) for f in report.findings] == [("invalid", kind, key)]
    assert detail in report.findings[0].detail
    repaired = fsck(store, repair=True)
    assert repaired.repair is not None and path.read_bytes() == body, f"repair never deletes a {kind}"
    return path


def test_an_unreadable_ref_or_history_record_is_a_finding_not_a_crash(project: dict[str, Path]) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    history = next(info.key for info in store.list("history/tiny/latest/"))
    path = store.local_path(history)
    assert path is not None
    _damaged(store, history, path.read_bytes()[:-7], "history record", "unreadable")  # truncated


def test_a_ref_naming_another_datasets_snapshot_is_a_finding(project: dict[str, Path]) -> None:  # noqa: F811
    """A ref record of dataset `other` naming tiny's snapshot (no prep command writes one; every
    command refuses to follow it) was a clean store to fsck."""
    store = LocalStore(project["store"])
    body = canonical.loads(store.get_bytes("refs/tiny/latest.json"))
    store.put_bytes("refs/other/latest.json", canonical.dumps({**body, "dataset": "other"}))
    _damaged(store, "refs/other/latest.json", store.get_bytes("refs/other/latest.json"), "ref",
             "of dataset 'tiny', not 'other'")


def test_an_unreadable_retention_policy_is_a_finding_repair_leaves(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: gc refuses to run on a damaged retention policy (a rebuild records it again),
    yet fsck called such a store clean."""
    store = LocalStore(project["store"])
    policy = max(info.key for info in store.list("retention/tiny/"))
    _damaged(store, policy, b"junk", "retention policy", "unreadable retention policy")


def test_an_unreadable_hold_is_a_finding_not_an_aborted_scrub(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: one damaged hold record stopped fsck with an error, where a bad ref is a finding."""
    store = LocalStore(project["store"])
    snapshot = resolve(store, "tiny@latest")
    place_hold(store, snapshot, "audit")
    _damaged(store, hold_key(snapshot.id), b"junk", "hold", "unreadable hold record")


@pytest.mark.parametrize(("stage", "kind"), [("dedup", "mask (dedup output)"), ("shuffle", "plan (shuffle output)")])
def test_a_flipped_mask_or_plan_of_a_layout_1_snapshot_is_found(
        project: dict[str, Path], stage: str, kind: str) -> None:  # noqa: F811
    store = LocalStore(project["store"])
    old = plant_layout1(store, resolve(store, "tiny@latest").id)
    assert fsck(store).clean
    manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, stage_output(store, old.snapshot, stage)))
    target = next(iter(manifest["outputs"].values()))
    flip(store, target, offset=0)
    report = fsck(store)
    assert [(f.problem, f.kind, f.key) for f in report.findings] == [
        ("corrupt", kind, object_key(hashing.parse_id(target)))]
    assert "tiny@old" in report.findings[0].by


def _intermediate_id(store: Store, tokenize: records.StageRecord) -> str:
    return str(canonical.loads(cas.get_bytes(store, tokenize.output))["tasks"][0]["output"])


def _other_keys_manifest(store: Store, tokenize: records.StageRecord) -> str:
    body = canonical.loads(cas.get_bytes(store, tokenize.output))
    return cas.put_bytes(store, canonical.dumps({**body, "key": "e" * 64})).id


@pytest.mark.parametrize("named", [_intermediate_id, _other_keys_manifest])
def test_a_stage_record_naming_what_is_not_its_manifest_is_removed_alone(
        project: dict[str, Path], named: Callable[[Store, records.StageRecord], str]) -> None:  # noqa: F811
    """Regressions: a stage record naming an intermediate made repair delete the intermediate's task
    record too; one naming another key's manifest (the build refuses it, pointing at repair) was clean."""
    store = LocalStore(project["store"])
    clean = resolve(store, "tiny@latest")
    key = next(info.key for info in store.list("stages/tokenize/"))
    tokenize = records.parse_record(key, store.get_bytes(key), key)
    assert isinstance(tokenize, records.StageRecord)
    path = store.local_path(key)
    assert path is not None
    path.chmod(0o644)
    path.write_bytes(canonical.dumps(records.StageRecord("tokenize", tokenize.key, named(store, tokenize)).to_json()))
    tasks = sorted(info.key for info in store.list("tasks/"))
    report = fsck(store, repair=True)
    assert [(f.problem, f.kind, f.key) for f in report.findings] == [("invalid", "stage record", key)]
    assert report.repair is not None and report.repair.records == (key,) and not report.repair.objects
    assert sorted(info.key for info in store.list("tasks/")) == tasks, "task records are not the stage record's fault"
    assert run_prep("build", project["v1"], "--store", project["store"], "--workers", "1").stdout.split()[-1] == clean.id
    assert fsck(store).clean


def test_a_corrupt_step_source_is_found_and_named(tmp_path: Path, tokenizer_path: Path) -> None:
    _, name = user_step_project(tmp_path, tokenizer_path)
    store = LocalStore(tmp_path / "store")
    snapshot = resolve(store, "tiny@latest")
    entry = next(e for e in snapshot.manifest["step_sources"] if e["path"] == f"{name}/rules.py")
    assert fsck(store).clean
    flip(store, entry["object"])
    report = fsck(store)
    assert [(f.problem, f.kind) for f in report.findings] == [("corrupt", f"step source {name}/rules.py")]
    assert "tiny@latest" in report.findings[0].by
