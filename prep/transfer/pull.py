"""Copy a snapshot's artifacts from a store to a local folder, safely and resumably.

Each file is written under a temporary name in its final folder, hashed while it is copied,
and renamed into place only once its size and SHA-256 match the manifest. A killed pull
leaves only temporaries, which the next pull removes before it starts. Files already valid
in DEST (proven by hashing, or by the record of an earlier proof whose stat stamp still
holds) are reused; `prune` then removes what DEST's previous snapshot named and this one
does not (see docs/pull-verify.md for the order and why a killed pull converges).
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prep import hashing
from prep.errors import NotFoundError, PrepError, UsageError
from prep.faults import crash_point
from prep.storage.base import Store
from prep.store import cas
from prep.store.snapshots import Snapshot, read_manifest_content
from prep.transfer.fetch import download_verified, write_all
from prep.transfer.shares import (
    PREP_DIR,
    Artifact,
    DestLock,
    PullRecord,
    Share,
    artifacts_of,
    check_paths,
    discard,
    remove_stale_temporaries,
    share_of,
    stamp,
    temp_name,
)
from prep.transfer.verify import (
    DEFAULT_JOBS,
    ByteCounter,
    ByteTally,
    FileDone,
    hash_file,
    run_parallel,
)
from prep.writeback import fsync_path

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class PullResult:
    """What one pull did: files and bytes copied, reused (already valid; `files_rehashed` of
    them proven by hashing, the rest by the record), pruned, left over, stale temps removed."""

    snapshot_id: str
    dest: Path
    share: Share
    files_copied: int
    bytes_copied: int
    files_reused: int
    bytes_reused: int
    files_rehashed: int
    files_pruned: int
    bytes_pruned: int
    files_left: int  # named by DEST's previous snapshot, not by this one, still there (not pruned)
    prune_warning: str | None  # why --prune deleted nothing
    temporaries_removed: int
    seconds: float


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prove(final: Path, artifact: Artifact, record: PullRecord, on_bytes: ByteCounter, stop: threading.Event) -> bool:
    """True when `final` already holds the artifact's bytes, proven by hashing; recorded then."""
    try:
        before = os.stat(final)
        if not stat.S_ISREG(before.st_mode) or before.st_size != artifact.size:
            return False
        found = hash_file(final, on_bytes, stop)
        _fsync_file(final)  # an entry is only recorded for bytes that are durable
        after = os.stat(final)
    except OSError:
        return False
    if found.changed or found.digest.sha256 != artifact.sha256 or stamp(before) != stamp(after):
        return False
    record.add(artifact.path, artifact.sha256, after)
    return True


def fetch_artifact(
    store: Store, dest: Path, artifact: Artifact, *, record: PullRecord, stale: bool, on_bytes: ByteCounter,
    stop: threading.Event
) -> bool:
    """Make DEST/<path> hold the artifact's bytes; False when it already did (proven by hashing,
    unless `stale`: the record shows it holds other bytes)."""
    final = dest / artifact.path
    if not stale and _prove(final, artifact, record, on_bytes, stop):
        return False
    key = cas.object_key(artifact.sha256)
    temp = temp_name(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        installed = download_verified(store, hashing.Digest(artifact.sha256, artifact.size), final, temp=temp,
                                      what=artifact.path, on_bytes=on_bytes, stop=stop)
        if installed is not None:
            record.add(artifact.path, artifact.sha256, installed)
    except NotFoundError:
        raise NotFoundError(f"{store.url}: object {key} for {artifact.path} is missing from the store") from None
    except OSError as exc:
        culprit = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != os.fspath(final) else ""
        raise UsageError(f"{final}: cannot copy into place: {exc.strerror or exc}{culprit}") from None
    finally:
        discard(temp)
    return True


def plan(dest: Path, artifacts: Iterable[Artifact], record: PullRecord) -> tuple[list[Artifact], list[Artifact], set[str]]:
    """(reused: valid by the record, to fetch, stale: paths the record shows hold other bytes),
    by one `stat` per file and no hashing."""
    reused: list[Artifact] = []
    fetch: list[Artifact] = []
    stale: set[str] = set()
    root = os.fspath(dest) + "/"
    for artifact in artifacts:
        try:
            info = os.stat(root + artifact.path)
        except OSError:
            fetch.append(artifact)
            continue
        proven = record.proven(artifact.path, info) if stat.S_ISREG(info.st_mode) else None
        if proven == artifact.sha256 and info.st_size == artifact.size:
            reused.append(artifact)
            continue
        fetch.append(artifact)
        if proven is not None or info.st_size != artifact.size:
            stale.add(artifact.path)
    return reused, fetch, stale


def _ancestors(path: str) -> Iterator[str]:
    """The folders above a relative path, deepest first, ending with "" (DEST itself)."""
    while path:
        path = path.rpartition("/")[0]
        yield path


def folders_to_sync(dest: Path, artifacts: Iterable[Artifact]) -> list[Path]:
    """Every folder from an artifact's parent up to `dest`, deepest first, so each new
    directory entry is durable after its contents."""
    parents = {artifact.path.rpartition("/")[0] for artifact in artifacts}
    folders = {folder for parent in parents for folder in _ancestors(parent + "/x")} | {""}
    return [dest / folder for folder in sorted(folders, key=lambda folder: (-folder.count("/") - bool(folder), folder))]


def write_manifest(dest: Path, raw: bytes) -> Path:
    """Store the manifest bytes at DEST/.prep/manifest.json atomically, so verification
    needs no store."""
    final = dest / PREP_DIR / MANIFEST_NAME
    final.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if final.read_bytes() == raw:  # a rerun: the same bytes are already in place
            fsync_path(final.parent)
            return final
    temp = temp_name(final)
    try:
        with io.FileIO(temp, "x") as out:
            write_all(out, raw)
            os.fsync(out.fileno())
        os.replace(temp, final)
    finally:
        discard(temp)
    fsync_path(final.parent)
    return final


def previous_paths(dest: Path, snapshot: Snapshot, named: set[str]) -> tuple[set[str] | None, str | None]:
    """The artifact paths DEST's manifest (an earlier pull's) names, read before it is
    replaced; or None and why it cannot be trusted (missing, not a valid manifest, unsafe)."""
    path = dest / PREP_DIR / MANIFEST_NAME
    try:
        if path.read_bytes() == snapshot.raw:
            return named, None
    except FileNotFoundError:
        return None, f"{path} does not exist (no earlier pull completed in this folder)"
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    try:
        artifacts = artifacts_of(read_manifest_content(path))
        for artifact in artifacts:
            artifact.path.encode()  # a lone surrogate: pull never wrote that (UnicodeError)
        check_paths(artifacts, dest, str(path))
    except PrepError as exc:
        return None, exc.message
    except UnicodeError as exc:
        return None, f"{path}: not a canonical prep manifest ({exc})"
    return {artifact.path for artifact in artifacts}, None


def prune(dest: Path, stale: Iterable[str], keep: set[str]) -> tuple[int, int]:
    """Delete the files at `stale` paths (never a folder), then the folders that leaves empty
    unless `keep` has paths below them, and fsync the folders that changed: (files, bytes)."""
    files = size = 0
    touched: set[str] = set()
    for path in sorted(stale):
        target = os.path.join(dest, path)
        try:
            info = os.lstat(target)
            if stat.S_ISDIR(info.st_mode):
                continue  # a folder where the old snapshot had a file: not pull's to remove
            os.unlink(target)
        except (FileNotFoundError, NotADirectoryError):
            continue
        files, size = files + 1, size + info.st_size
        touched.update(_ancestors(path))
        crash_point("pull.after_prune")
    if touched:
        containers = {folder for path in keep for folder in _ancestors(path)}
        for folder in sorted(touched - containers - {""}, key=lambda f: -f.count("/")):
            with contextlib.suppress(OSError):  # not empty: someone else's files stay
                os.rmdir(os.path.join(dest, folder))
        for folder in touched:
            if os.path.isdir(os.path.join(dest, folder)):
                fsync_path(dest / folder)
    return files, size


def _transfer(
    store: Store, dest: Path, share: Share, record: PullRecord, jobs: int, on_bytes: ByteCounter | None,
    on_file: FileDone | None
) -> tuple[list[Artifact], list[Artifact], int]:
    """Copy what DEST lacks: (copied, reused, how many of the reused were proven by hashing)."""
    ordered = sorted(share.artifacts, key=lambda a: (-a.size, a.path))
    reused, fetch, stale = plan(dest, ordered, record)
    if on_file is not None:
        for artifact in reused:
            on_file(artifact)
    tally = ByteTally(on_bytes)

    def work(artifact: Artifact, stop: threading.Event) -> bool:
        return fetch_artifact(store, dest, artifact, record=record, stale=artifact.path in stale, on_bytes=tally.add,
                              stop=stop)

    try:
        copied = run_parallel(work, fetch, jobs, on_file)
    finally:
        record.close()
    hashed = [artifact for artifact, was_copied in zip(fetch, copied) if not was_copied]
    return [artifact for artifact, was_copied in zip(fetch, copied) if was_copied], reused + hashed, len(hashed)


def pull(
    store: Store,
    snapshot: Snapshot,
    dest: Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    jobs: int = DEFAULT_JOBS,
    prune_old: bool = False,
    on_bytes: ByteCounter | None = None,
    on_file: FileDone | None = None,
) -> PullResult:
    """Copy the snapshot (or one rank's share) into `dest`, reusing files already valid; with
    `prune_old`, then delete what DEST's previous snapshot named and this one does not. Returns
    only once every file, folder, deletion and the manifest copy are durable."""
    started = time.perf_counter()
    everything = artifacts_of(snapshot.manifest)
    check_paths(everything, dest, snapshot.id)
    share = share_of(everything, rank, world_size)
    named = {artifact.path for artifact in everything}
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{dest}: cannot create folder: {exc.strerror or exc}") from None
    try:
        with DestLock(dest):
            previous, problem = previous_paths(dest, snapshot, named)  # before anything changes
            parents = {artifact.path.rpartition("/")[0] for artifact in everything}
            removed = remove_stale_temporaries({dest / parent for parent in parents} | {dest / PREP_DIR})
            record = PullRecord(dest)
            copied, reused, rehashed = _transfer(store, dest, share, record, jobs, on_bytes, on_file)
            for folder in folders_to_sync(dest, share.artifacts):
                fsync_path(folder)
            leftover = sorted(previous - named) if previous is not None else []
            pruned = prune(dest, leftover, named) if prune_old else (0, 0)  # only once all of it is in place
            left = 0 if prune_old else sum(1 for path in leftover if os.path.lexists(os.path.join(dest, path)))
            record.compact(named)
            crash_point("pull.before_manifest")
            write_manifest(dest, snapshot.raw)  # last: its presence means the pull completed
    except OSError as exc:
        raise UsageError(f"{exc.filename or dest}: {exc.strerror or exc}") from None
    return PullResult(
        snapshot_id=snapshot.id, dest=dest, share=share,
        files_copied=len(copied), bytes_copied=sum(a.size for a in copied),
        files_reused=len(reused), bytes_reused=sum(a.size for a in reused), files_rehashed=rehashed,
        files_pruned=pruned[0], bytes_pruned=pruned[1], files_left=left,
        prune_warning=problem if prune_old and previous is None else None,
        temporaries_removed=removed, seconds=time.perf_counter() - started,
    )
