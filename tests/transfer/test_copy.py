"""`prep copy`: a real build's snapshot copied between local and S3 (moto) stores, create-only and
proven; the target passes fsck and gives the same snapshot id back; a killed copy resumes copying
only what is missing; corrupt bytes on either side are refused and never overwritten; `--refs`
moves refs by compare-and-swap and loses cleanly to a concurrent move."""

from __future__ import annotations

import json
import signal
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from prep import hashing
from prep.errors import IntegrityError, RefConflictError, StaleRefError, UsageError
from prep.manifest.schema import validate
from prep.storage import LocalStore, open_store
from prep.storage.backend import Store
from prep.store import cas
from prep.store.fsck import fsck
from prep.store.gc import collect_garbage
from prep.store.layout import OBJECTS_PREFIX, object_sha, snapshot_marker_key
from prep.store.refs import move_ref, read_ref, update_ref
from prep.store.snapshots import Snapshot, resolve
from prep.transfer.copy import Item, copy_item, copy_snapshot
from prep.transfer.fetch import COPY_SIZE
from tests.helpers import prep_env, run_prep
from tests.store.test_fsck import first_intermediate, flip
from tests.store.test_gc import project, reachable, template  # noqa: F401  (module fixtures)

Project = dict[str, Path]


def stored(store: Store) -> set[str]:
    """The SHA-256s of every object in a store."""
    return {object_sha(info.key) for info in store.list(OBJECTS_PREFIX)}


def source_of(project: Project) -> tuple[LocalStore, Snapshot]:  # noqa: F811
    store = LocalStore(project["store"])
    return store, resolve(store, "tiny@latest")


def assert_copy_of(target: Store, source: Store, snapshot: Snapshot) -> None:
    """The target holds exactly what gc keeps for the snapshot, byte for byte, and passes fsck."""
    assert stored(target) == reachable(source, snapshot.id)
    assert resolve(target, snapshot.id).raw == snapshot.raw
    assert target.exists(snapshot_marker_key(snapshot.id))
    report = fsck(target)
    assert report.clean, report.findings
    assert not report.dangling


def test_local_to_local_copies_what_gc_keeps_and_a_rerun_copies_nothing(project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = source_of(project)
    target = LocalStore(tmp_path / "second")
    result = copy_snapshot(source, target, snapshot, label="tiny@latest", jobs=3)
    assert_copy_of(target, source, snapshot)
    assert (result.copied, result.present, result.objects) == (len(stored(target)), 0, len(stored(target)))
    assert result.bytes_copied == result.bytes == sum(info.size for info in target.list(OBJECTS_PREFIX))
    assert result.marker_written and result.refs == ()
    assert read_ref(target, "tiny", "latest") is None, "refs move only with --refs"
    assert not [*target.list("tasks/"), *target.list("stages/"), *target.list("packs/")], "no commit record is copied"
    validate(result.to_json(), "prep.copy-report/1", "report")
    again = copy_snapshot(source, target, snapshot, label="tiny@latest")
    assert (again.copied, again.present, again.rehashed, again.marker_written) == (0, result.objects, result.objects,
                                                                                   False)
    third = copy_snapshot(source, target, snapshot, label="tiny@latest")
    assert (third.copied, third.rehashed) == (0, 0), "proven by the stamps the second run recorded"


def test_local_to_s3_and_back_gives_the_same_bytes_and_id(project: Project, s3_bucket: str,  # noqa: F811
                                                         tmp_path: Path) -> None:
    source, snapshot = source_of(project)
    s3 = open_store(f"{s3_bucket}/copy")
    there = copy_snapshot(source, s3, snapshot, label="tiny@latest", refs=True)
    assert_copy_of(s3, source, snapshot)
    assert [(ref.name, ref.generation, ref.moved) for ref in there.refs] == [("latest", 1, True)]
    back = LocalStore(tmp_path / "back")
    result = run_prep("copy", "tiny@latest", "--store", s3.url, "--to", back.root, "--refs", "--json")
    report = json.loads(result.stdout)
    validate(report, "prep.copy-report/1", "stdout")
    assert report["snapshot"] == snapshot.id and report["copied"]["count"] == report["objects"]["count"]
    assert_copy_of(back, source, snapshot)
    returned = resolve(back, "tiny@latest")
    assert (returned.id, returned.raw) == (snapshot.id, snapshot.raw)
    assert run_prep("fsck", "--store", back.root).returncode == 0
    assert "copied " + snapshot.id in result.stderr
    again = copy_snapshot(s3, open_store(f"{s3_bucket}/again"), returned, label="tiny@latest")  # S3 to S3
    assert again.copied == again.objects
    assert_copy_of(open_store(f"{s3_bucket}/again"), source, snapshot)


def test_a_killed_copy_reruns_and_copies_only_what_is_missing(project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = source_of(project)
    target = tmp_path / "second"
    args = ("copy", "tiny@latest", "--store", project["store"], "--to", target, "--jobs", "1")
    killed = run_prep(*args, check=False, env=prep_env(PREP_CRASH_AT="copy.after_object:3"), new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    partial = LocalStore(target)
    assert len(stored(partial)) == 3 and not partial.exists(snapshot_marker_key(snapshot.id))
    assert hashing.parse_id(snapshot.id) not in stored(partial), "the snapshot manifest goes last"
    report = json.loads(run_prep(*args, "--json").stdout)
    assert (report["present"]["count"], report["present"]["rehashed"]) == (3, 3)
    assert report["copied"]["count"] == report["objects"]["count"] - 3
    assert_copy_of(partial, source, snapshot)
    again = json.loads(run_prep(*args, "--json").stdout)
    assert again["copied"]["count"] == 0
    assert again["present"]["rehashed"] == report["copied"]["count"], "the 3 checked by the rerun are proven by stamp"


def test_a_corrupt_source_object_is_refused_and_nothing_of_it_reaches_the_target(
        project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = source_of(project)
    victim = first_intermediate(source, snapshot)
    flip(source, victim)
    target = tmp_path / "second"
    result = run_prep("copy", "tiny@latest", "--store", project["store"], "--to", target, check=False)
    assert result.returncode == IntegrityError.exit_code
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("prep: error: ") and victim in line and "does not hash to its name" in line
    copy = LocalStore(target)
    assert hashing.parse_id(victim) not in stored(copy)
    assert not copy.exists(snapshot_marker_key(snapshot.id))
    assert not [path for path in (target / "tmp").rglob("*") if path.is_file()], "no temporary left behind"


def test_a_corrupt_or_missing_source_manifest_or_object_stops_the_copy_before_anything_is_written(
        project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = source_of(project)
    target = LocalStore(tmp_path / "second")
    victim = first_intermediate(source, snapshot)
    stage = str(snapshot.manifest["stages"][0]["output"])
    damages: tuple[tuple[Callable[[], object], str], ...] = ((lambda: source.delete(cas.object_key(hashing.parse_id(victim))),
                f"intermediate \\(tokenize output\\) {victim}, .* is missing"),
               (lambda: flip(source, stage), f"stage manifest \\(tokenize\\) {stage}, .* does not hash to its name"),
               (lambda: source.delete(cas.object_key(hashing.parse_id(stage))),
                f"stage manifest \\(tokenize\\) {stage}, .* is missing"))
    for damage, message in damages:
        damage()
        with pytest.raises(IntegrityError, match=message):
            copy_snapshot(source, target, snapshot, label="tiny@latest")
        assert stored(target) == set()


def test_an_object_on_the_target_with_other_bytes_is_reported_not_overwritten(project: Project,  # noqa: F811
                                                                             tmp_path: Path) -> None:
    source, snapshot = source_of(project)
    target = LocalStore(tmp_path / "second")
    copy_snapshot(source, target, snapshot, label="tiny@latest")
    artifact = f"sha256:{snapshot.artifacts[0]['sha256']}"
    flip(target, artifact)
    damaged = target.get_bytes(cas.object_key(hashing.parse_id(artifact)))
    result = run_prep("copy", snapshot.id, "--store", project["store"], "--to", target.root, check=False)
    assert result.returncode == IntegrityError.exit_code
    line = result.stderr.strip().splitlines()[-1]
    assert artifact in line and "already there with other bytes" in line and "delete" in line
    assert target.get_bytes(cas.object_key(hashing.parse_id(artifact))) == damaged, "never overwritten"


def test_refs_move_by_compare_and_swap_and_lose_to_a_concurrent_move(project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = source_of(project)
    target = LocalStore(tmp_path / "second")
    other = "sha256:" + "ab" * 32

    def race(item: Item) -> None:  # another publisher moves the target's ref while the copy runs
        if read_ref(target, "tiny", "latest") is None:
            move_ref(target, "tiny", "latest", other)

    with pytest.raises(StaleRefError, match="tiny@latest is generation 1 .*not absent as expected; left unmoved"):
        copy_snapshot(source, target, snapshot, label="tiny@latest", refs=True, on_file=race)
    assert read_ref(target, "tiny", "latest").snapshot == other  # type: ignore[union-attr]
    assert target.exists(snapshot_marker_key(snapshot.id)), "the snapshot itself is copied"
    moved = copy_snapshot(source, target, snapshot, label="tiny@latest", refs=True)
    assert [(ref.name, ref.generation, ref.moved) for ref in moved.refs] == [("latest", 2, True)]
    assert read_ref(target, "tiny", "latest").snapshot == snapshot.id  # type: ignore[union-attr]
    assert moved.copied == 0
    assert collect_garbage(target, grace_seconds=0).deleted["objects"].count == 0, "gc keeps the whole copy"
    assert fsck(target).clean


def test_tags_stay_put_on_the_target_and_refs_need_a_ref(project: Project, tmp_path: Path) -> None:  # noqa: F811
    source, snapshot = source_of(project)
    target = LocalStore(tmp_path / "second")
    with pytest.raises(UsageError, match="the same"):
        copy_snapshot(source, LocalStore(project["store"]), snapshot, label="tiny@latest")
    move_ref(source, "tiny", "v1", snapshot.id)
    move_ref(target, "tiny", "v1", "sha256:" + "cd" * 32)
    with pytest.raises(RefConflictError, match="tags stay put"):
        copy_snapshot(source, target, snapshot, label="tiny@v1", refs=True)
    assert stored(target) == set(), "refused before anything was copied"
    for name in ("latest", "v1"):
        update_ref(source, "tiny", name, snapshot.id, delete=True)
    with pytest.raises(UsageError, match="--refs: no ref of tiny"):
        copy_snapshot(source, LocalStore(tmp_path / "third"), snapshot, label=snapshot.id, refs=True)


def test_an_object_is_streamed_not_read_whole(tmp_path: Path) -> None:
    """A 64 MiB object goes through the copy holding about one 8 MiB chunk, never the object."""
    source, target = LocalStore(tmp_path / "source"), LocalStore(tmp_path / "target")
    big = tmp_path / "big"
    with open(big, "wb") as out:
        for index in range(64):
            out.write(index.to_bytes(4, "little") * (1 << 18))
    digest = cas.put_file(source, big)
    item = Item(digest.sha256, digest.size, "artifact bin/00000.bin", "a test")
    tracemalloc.start()
    try:
        assert copy_item(source, target, item, lambda size: None, threading.Event())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < COPY_SIZE + (1 << 20) and digest.size == 8 * COPY_SIZE, f"held {peak} bytes copying {digest.size}"
    assert cas.check(target, digest.id) and not list((target.root / "tmp").iterdir())
