"""Pulling a new version into a folder holding an older one: copy only what changed, report the
reuse, prune only what the older manifest named, and converge after a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from prep.storage.local import LocalStore
from prep.transfer.pull import pull
from prep.transfer.verify import Problem, verify
from tests.snapshot_factory import Built, build_snapshot, derive_snapshot

SHARDS = (40_000, 25_000, 9_000, 12_000)
CHANGED = ("bin/00001.bin", "bin/00001.idx")
REMOVED = ("wds/00002.tar", "legacy/00003.tar")
ADDED = (("wds/00004.tar", "wds", 4),)
USER_FILES = ("bin/notes.txt", "mine.txt", "legacy/keep/readme.md", ".prep/user-note")
USER_EXTRA = [("extra", "bin/notes.txt")]  # the one user file inside an artifact folder, which verify reports


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def old(store: LocalStore, tmp_path: Path) -> Built:
    """Four shards of bin+idx+wds, plus a file in a folder only this version has."""
    base = build_snapshot(store, tmp_path / "work-base", shard_sizes=SHARDS, ref=None)
    return derive_snapshot(store, base, tmp_path / "work-old", added=[("legacy/00003.tar", "wds", 3)], ref="v1")


@pytest.fixture
def new(store: LocalStore, old: Built, tmp_path: Path) -> Built:
    return derive_snapshot(store, old, tmp_path / "work-new", changed=CHANGED, removed=REMOVED, added=ADDED, ref="v2")


def kinds(problems: Iterable[Problem]) -> list[tuple[str, str]]:
    return sorted((p.kind, p.path) for p in problems)


def add_user_files(dest: Path) -> None:
    for name in USER_FILES:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text("the user's own file\n")


def test_a_new_version_copies_only_what_changed_and_reports_the_reuse(
    store: LocalStore, old: Built, new: Built, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    result = pull(store, new.snapshot, dest)
    unchanged = [path for path in new.files if path in old.files and path not in CHANGED]
    assert (result.files_copied, result.bytes_copied) == (3, sum(len(new.files[p]) for p in [*CHANGED, "wds/00004.tar"]))
    assert (result.files_reused, result.bytes_reused) == (len(unchanged), sum(len(new.files[p]) for p in unchanged))
    assert result.files_rehashed == 0  # proven by the record of the first pull, not by reading them again
    assert (result.files_pruned, result.files_left, result.prune_warning) == (0, 2, None)
    for path, data in new.files.items():
        assert (dest / path).read_bytes() == data  # the changed files were replaced
    # verify looks for extras in the new snapshot's artifact folders only (bin/, wds/), not in legacy/
    assert kinds(verify(new.snapshot, dest).problems) == [("extra", "wds/00002.tar")]


def test_prune_removes_what_the_old_snapshot_named_and_nothing_else(
    store: LocalStore, old: Built, new: Built, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    add_user_files(dest)
    result = pull(store, new.snapshot, dest, prune_old=True)
    assert (result.files_pruned, result.bytes_pruned) == (2, sum(len(old.files[p]) for p in REMOVED))
    assert (result.files_copied, result.files_left, result.prune_warning) == (3, 0, None)
    assert kinds(verify(new.snapshot, dest).problems) == USER_EXTRA
    for name in USER_FILES:
        assert (dest / name).read_text() == "the user's own file\n"
    assert (dest / "legacy/keep").is_dir()  # a folder the user still uses stays
    assert (dest / ".prep/manifest.json").read_bytes() == new.snapshot.raw
    again = pull(store, new.snapshot, dest, prune_old=True)
    assert (again.files_copied, again.files_pruned, again.files_rehashed) == (0, 0, 0)


def test_after_prune_verify_passes_with_no_extras(store: LocalStore, old: Built, new: Built, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    pull(store, new.snapshot, dest, prune_old=True)
    assert verify(new.snapshot, dest).ok
    assert not (dest / "legacy").exists()  # the folder it emptied is gone
    assert (dest / "wds").is_dir() and (dest / "bin").is_dir()


def _no_manifest(dest: Path) -> None:
    (dest / ".prep/manifest.json").unlink()


def _corrupt(dest: Path) -> None:
    path = dest / ".prep/manifest.json"
    path.write_bytes(path.read_bytes()[:-40])


def _not_a_manifest(dest: Path) -> None:
    (dest / ".prep/manifest.json").write_text('{"schema": "prep.snapshot/1", "artifacts": []}')


def _unencodable(dest: Path) -> None:
    path = dest / ".prep/manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"wds/00002.tar"', b'"wds/\\udc80.tar"'))


@pytest.mark.parametrize(("damage", "reason"), [(_no_manifest, "does not exist"), (_corrupt, "not JSON"),
                                                (_not_a_manifest, "does not match"),
                                                (_unencodable, "can't encode")],
                         ids=["missing", "truncated", "not-a-manifest", "lone-surrogate"])
def test_without_a_trustworthy_old_manifest_prune_deletes_nothing_and_says_so(
    store: LocalStore, old: Built, new: Built, tmp_path: Path, damage: Callable[[Path], None], reason: str
) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    damage(dest)
    result = pull(store, new.snapshot, dest, prune_old=True)
    assert result.files_pruned == 0
    assert result.prune_warning is not None and reason in result.prune_warning
    assert all((dest / path).exists() for path in REMOVED)
    assert kinds(verify(new.snapshot, dest).problems) == [("extra", "wds/00002.tar")]


def test_an_old_manifest_naming_paths_outside_dest_is_not_trusted(
    store: LocalStore, old: Built, new: Built, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "00002.tar").write_bytes(b"not pull's")
    (dest / "wds/00002.tar").unlink()
    (dest / "legacy/00003.tar").unlink()
    os.rmdir(dest / "legacy")
    (dest / "legacy").symlink_to(outside)  # legacy/00003.tar, named by the old manifest, now points away
    result = pull(store, new.snapshot, dest, prune_old=True)
    assert result.files_pruned == 0 and result.prune_warning is not None and "outside" in result.prune_warning
    assert (outside / "00002.tar").read_bytes() == b"not pull's"


def test_prune_never_deletes_a_new_file_a_symlinked_folder_makes_an_old_path_reach(
    store: LocalStore, old: Built, new: Built, tmp_path: Path
) -> None:
    """Regression: with DEST/legacy a symlink to DEST/wds (inside DEST, so allowed), pruning the
    old `legacy/00004.tar` unlinked the new `wds/00004.tar`; the pull still succeeded and left
    DEST missing a file of the snapshot it had just declared complete."""
    older = derive_snapshot(store, old, tmp_path / "work-older", removed=["legacy/00003.tar"],
                            added=[("legacy/00004.tar", "wds", 4)], ref=None)
    dest = tmp_path / "dest"
    pull(store, older.snapshot, dest)
    (dest / "legacy/00004.tar").unlink()
    os.rmdir(dest / "legacy")
    (dest / "legacy").symlink_to("wds")  # the old path legacy/00004.tar now lands on the new wds/00004.tar
    result = pull(store, new.snapshot, dest, prune_old=True)
    assert result.files_pruned == 1 and not (dest / "wds/00002.tar").exists()
    assert (dest / "wds/00004.tar").read_bytes() == new.files["wds/00004.tar"]
    assert kinds(verify(new.snapshot, dest).problems) == []


def test_prune_in_a_folder_holding_one_rank_share(store: LocalStore, old: Built, new: Built, tmp_path: Path) -> None:
    for rank in range(2):
        dest = tmp_path / f"rank{rank}"
        before = pull(store, old.snapshot, dest, rank=rank, world_size=2)
        result = pull(store, new.snapshot, dest, rank=rank, world_size=2, prune_old=True)
        held = {a.path for a in before.share.artifacts}
        assert result.files_pruned == len(held & set(REMOVED))
        assert verify(new.snapshot, dest, rank=rank, world_size=2).ok
        on_disk = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() and ".prep" not in p.parts}
        assert on_disk <= set(new.files)  # only the new snapshot's files, some of another rank's share


def test_a_file_changed_in_place_is_not_trusted_by_the_record(store: LocalStore, old: Built, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    target = dest / "bin/00000.bin"
    before = target.stat()
    with open(target, "r+b") as handle:
        handle.write(b"X")  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # even with its mtime put back
    (dest / "wds/00000.tar").rename(dest / "wds/moved")
    (dest / "wds/moved").rename(dest / "wds/00000.tar")  # same bytes, same inode, new ctime: re-hashed
    result = pull(store, old.snapshot, dest)
    assert (result.files_copied, result.files_rehashed) == (1, 1)
    assert target.read_bytes() == old.files["bin/00000.bin"]


def test_a_torn_or_foreign_record_only_costs_rehashing(store: LocalStore, old: Built, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    record = dest / ".prep/verified.jsonl"
    lines = record.read_bytes().splitlines(keepends=True)
    record.write_bytes(b"".join(lines[:3]) + b'["not", "a record"]\n\x00\x00garbage\n' * 100 + lines[3][:20])
    result = pull(store, old.snapshot, dest)
    assert (result.files_copied, result.files_reused, result.files_rehashed) == (0, len(old.files), len(old.files) - 3)
    assert len(record.read_bytes().splitlines()) == len(old.files)  # compacted: it had grown past twice that
    again = pull(store, old.snapshot, dest)
    assert (again.files_copied, again.files_rehashed) == (0, 0)


def _cli(dest: Path, store: LocalStore, ref: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "prep.cli.main", "pull", ref, str(dest), "--store", str(store.root), "--prune",
               "--jobs", "1"]
    env = dict(os.environ, **({"PREP_CRASH_AT": crash_at} if crash_at else {}))
    return subprocess.run(command, env=env, capture_output=True, text=True, start_new_session=True, check=False)


@pytest.mark.parametrize("crash_at", ["pull.after_chunk:2", "pull.after_prune:1", "pull.before_manifest"])
def test_a_pruning_pull_killed_anywhere_converges_on_rerun(
    store: LocalStore, old: Built, new: Built, tmp_path: Path, crash_at: str
) -> None:
    dest = tmp_path / "dest"
    pull(store, old.snapshot, dest)
    add_user_files(dest)
    killed = _cli(dest, store, "demo@v2", crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (dest / ".prep/manifest.json").read_bytes() == old.snapshot.raw  # the old manifest is replaced last
    still_there = [path for path in REMOVED if (dest / path).exists()]
    if crash_at.startswith("pull.after_chunk"):
        assert still_there == list(REMOVED)  # nothing is deleted before every new file is in place
    else:
        assert len(still_there) < len(REMOVED)
        assert not [p for p in verify(new.snapshot, dest).problems if p.kind != "extra"]  # all of new is there

    rerun = _cli(dest, store, "demo@v2")
    assert rerun.returncode == 0, rerun.stderr
    assert kinds(verify(new.snapshot, dest).problems) == USER_EXTRA
    assert (dest / ".prep/manifest.json").read_bytes() == new.snapshot.raw
    assert all((dest / name).exists() for name in USER_FILES)
