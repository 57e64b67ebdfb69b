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
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, PrepError, StorageIOError, UsageError
from prep.faults import crash_point
from prep.hashing import parse_id
from prep.storage import LocalStore
from prep.storage.backend import Store
from prep.store import cas
from prep.store.marker import MARKER_KEY, is_store
from prep.store.snapshots import Snapshot
from prep.transfer.derived import derived_files, install_derived
from prep.transfer.fetch import download_verified
from prep.transfer.held import ShareRecord, ShareSpec, install_bytes, write_share_record
from prep.transfer.paths import TOKENIZER_NAME
from prep.transfer.prune import MANIFEST_NAME, ancestors, previous_paths, prune
from prep.transfer.shares import (
    IO_ERRNOS,
    PARTIAL_TAG,
    PREP_DIR,
    TEMP_MARKER,
    Artifact,
    DestLock,
    PullRecord,
    Share,
    artifacts_of,
    check_paths,
    discard,
    partial_name,
    remove_stale_temporaries,
    share_of,
    stamp,
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

PULL_REPORT_SCHEMA = "prep.pull-report/1"


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
    ranked: bool = False  # --rank/--world-size were given
    files_resumed: int = 0  # copied files that continued a partial a killed run left
    bytes_resumed: int = 0  # bytes of those partials kept (re-hashed, not fetched again)
    tokenizer: str | None = None  # DEST's copy of the tokenizer file (None: the snapshot does not carry it)

    @property
    def bytes_fetched(self) -> int:
        """Bytes read from the store: copied minus resumed."""
        return self.bytes_copied - self.bytes_resumed

    @property
    def warnings(self) -> list[str]:
        """An empty share, and why --prune deleted nothing."""
        found = [self.share.warning] if self.share.warning else []
        if self.tokenizer is None:
            found.append(f"snapshot {self.snapshot_id[:19]} was built before snapshots carried their tokenizer file: "
                         f"no {PREP_DIR}/{TOKENIZER_NAME} (decode with the tokenizer whose sha256 its manifest names)")
        return found + ([f"--prune deleted nothing: {self.prune_warning}"] if self.prune_warning else [])

    def to_json(self) -> dict[str, Any]:
        """The prep.pull-report/1 document (manifests/pull-report-1.schema.json)."""
        def tally(files: int, size: int) -> dict[str, int]:
            return {"files": files, "bytes": size}
        ranked = self.share.world_size if self.ranked else None
        return {
            "schema": PULL_REPORT_SCHEMA, "snapshot": self.snapshot_id, "dest": str(self.dest),
            "rank": self.share.rank if self.ranked else None, "world_size": ranked,
            "formats": list(self.share.formats) if self.share.formats is not None else None,
            "share": tally(len(self.share.artifacts), self.share.size),
            "copied": tally(self.files_copied, self.bytes_copied),
            "resumed": tally(self.files_resumed, self.bytes_resumed),
            "reused": tally(self.files_reused, self.bytes_reused), "rehashed_files": self.files_rehashed,
            "pruned": tally(self.files_pruned, self.bytes_pruned), "left_files": self.files_left,
            "temporaries_removed": self.temporaries_removed, "seconds": round(self.seconds, 6),
            "tokenizer": self.tokenizer, "warnings": self.warnings,
        }


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
    stop: threading.Event, on_resumed: ByteCounter | None = None
) -> bool:
    """Make DEST/<path> hold the artifact's bytes, continuing a partial a killed run left; False
    when it already did (proven by hashing, unless `stale`: the record shows other bytes)."""
    final = dest / artifact.path
    if not stale and _prove(final, artifact, record, on_bytes, stop):
        return False
    key = cas.object_key(artifact.sha256)
    temp = partial_name(final, artifact.sha256)  # kept on failure: the next run resumes it
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        installed = download_verified(store, hashing.Digest(artifact.sha256, artifact.size), final, temp=temp,
                                      what=artifact.path, on_bytes=on_bytes, stop=stop, resume=True,
                                      on_resumed=on_resumed)
        if installed is not None:
            record.add(artifact.path, artifact.sha256, installed)
    except NotFoundError:
        discard(temp)
        raise NotFoundError(f"{store.url}: object {key} for {artifact.path} is missing from the store") from None
    except OSError as exc:
        _discard_empty(temp)
        named = exc.filename if isinstance(exc.filename, str) else None  # FileIO names an fd by its number
        culprit = f" ({named})" if named and named != os.fspath(final) else ""
        raise failure(exc, final, f"{final}: cannot copy into place: {exc.strerror or exc}{culprit}") from None
    except BaseException:  # stopped (another file failed, Ctrl-C): what was copied stays, to resume
        _discard_empty(temp)
        raise
    return True


def failure(exc: OSError, path: str | os.PathLike[str], message: str) -> PrepError:
    """What a failed write into DEST raises: a full disk or an I/O error is a StorageIOError (exit 4,
    as everywhere), anything else (a folder in a file's place, no permission) a UsageError."""
    if exc.errno in IO_ERRNOS:
        return StorageIOError.from_os_error("writing", path, exc)
    return UsageError(message)


def _discard_empty(partial: Path) -> None:
    """Remove a partial file with nothing in it to resume from."""
    with contextlib.suppress(OSError):
        if partial.stat().st_size == 0:
            partial.unlink()


def resumable_partial(wanted: Mapping[str, str], dest: Path) -> Callable[[Path, str], bool]:
    """A `keep` test for `remove_stale_temporaries`: true for the partial file of an artifact in
    `wanted` (path -> SHA-256); costs nothing per artifact, only per temporary found."""
    root = os.fspath(dest)

    def keep(folder: Path, name: str) -> bool:
        final, marker, digest = name.rpartition(TEMP_MARKER + PARTIAL_TAG)
        relative = os.path.relpath(os.path.join(folder, final[1:]), root) if marker and final else ""
        return bool(relative) and wanted.get(relative.replace(os.sep, "/"), "")[:16] == digest

    return keep


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


def folders_to_sync(dest: Path, artifacts: Iterable[Artifact]) -> list[Path]:
    """Every folder from an artifact's parent up to `dest`, deepest first, so each new
    directory entry is durable after its contents."""
    parents = {artifact.path.rpartition("/")[0] for artifact in artifacts}
    folders = {folder for parent in parents for folder in ancestors(parent + "/x")} | {""}
    return [dest / folder for folder in sorted(folders, key=lambda folder: (-folder.count("/") - bool(folder), folder))]


def install_tokenizer(store: Store, dest: Path, manifest: Mapping[str, Any]) -> str | None:
    """Put the snapshot's tokenizer file at DEST/.prep/tokenizer.json (checked against its object
    id and the manifest's sha256 before it is written), so training and evaluation can decode the
    tokens with no access to the build machine; None for a snapshot that does not carry it."""
    tokenizer = manifest["tokenizer"]
    object_id = tokenizer.get("object")
    if object_id is None:
        return None
    if parse_id(str(object_id)) != tokenizer["sha256"]:
        raise IntegrityError(f"snapshot manifest: tokenizer object {object_id} is not the file of sha256 "
                             f"{tokenizer['sha256']}")
    install_bytes(dest / PREP_DIR / TOKENIZER_NAME, cas.get_bytes(store, str(object_id)))
    return f"{PREP_DIR}/{TOKENIZER_NAME}"


def write_manifest(dest: Path, raw: bytes) -> Path:
    """Store the manifest bytes at DEST/.prep/manifest.json atomically, so verification
    needs no store."""
    final = dest / PREP_DIR / MANIFEST_NAME
    install_bytes(final, raw)
    return final


@dataclass(frozen=True)
class _Moved:
    """What `_transfer` did: copied, reused, how many of the reused were proven by hashing, and
    the copies that resumed a partial (count, bytes kept)."""

    copied: list[Artifact]
    reused: list[Artifact]
    rehashed: int
    resumed: tuple[int, int]


def _transfer(
    store: Store, dest: Path, share: Share, record: PullRecord, jobs: int, on_bytes: ByteCounter | None,
    on_file: FileDone | None
) -> _Moved:
    """Copy what DEST lacks, largest files first."""
    ordered = sorted(share.artifacts, key=lambda a: (-a.size, a.path))
    reused, fetch, stale = plan(dest, ordered, record)
    if on_file is not None:
        for artifact in reused:
            on_file(artifact)
    tally, kept, resumed = ByteTally(on_bytes), ByteTally(), ByteTally()

    def on_resumed(count: int) -> None:
        kept.add(count)
        resumed.add(1)

    def work(artifact: Artifact, stop: threading.Event) -> bool:
        return fetch_artifact(store, dest, artifact, record=record, stale=artifact.path in stale, on_bytes=tally.add,
                              stop=stop, on_resumed=on_resumed)

    try:
        copied = run_parallel(work, fetch, jobs, on_file)
    finally:
        record.close()
    hashed = [artifact for artifact, was_copied in zip(fetch, copied) if not was_copied]
    return _Moved([artifact for artifact, was_copied in zip(fetch, copied) if was_copied], reused + hashed,
                  len(hashed), (resumed.total, kept.total))


def _check_dest(store: Store, dest: Path) -> None:
    """Refuse a DEST inside the store pulled from, or one that is a prep store: the pulled
    files and DEST/.prep would land among a store's own keys."""
    marker = store.local_path(MARKER_KEY)
    resolved = dest.resolve()
    if marker is not None and resolved.is_relative_to(marker.parent.resolve()):
        raise UsageError(f"{dest}: inside the store {store.url} pulled from; pull into a folder of its own")
    if resolved.is_dir() and is_store(LocalStore(resolved)):
        raise UsageError(f"{dest}: a prep store; pull into a folder of its own")


def _make_dest(dest: Path) -> None:
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise failure(exc, dest, f"{dest}: cannot create folder: {exc.strerror or exc}") from None


def pull(
    store: Store,
    snapshot: Snapshot,
    dest: Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    formats: tuple[str, ...] | None = None,
    jobs: int = DEFAULT_JOBS,
    prune_old: bool = False,
    on_bytes: ByteCounter | None = None,
    on_file: FileDone | None = None,
) -> PullResult:
    """Copy the snapshot (or one rank's share, of the selected formats) into `dest`, reusing
    files already valid; with `prune_old`, then delete what DEST's previous snapshot named and
    this one does not. Records the share held, then the manifest; returns only once every file,
    folder, deletion and both records are durable."""
    started = time.perf_counter()
    everything = artifacts_of(snapshot.manifest)
    check_paths((artifact.path for artifact in everything), dest, snapshot.id)
    share = share_of(everything, rank, world_size, formats, snapshot.id)
    named = {artifact.path for artifact in everything}
    _check_dest(store, dest)
    _make_dest(dest)
    try:
        with DestLock(dest):
            previous, problem = previous_paths(dest, snapshot, named)  # before anything changes
            parents = {artifact.path.rpartition("/")[0] for artifact in everything}
            resumable = resumable_partial({a.path: a.sha256 for a in share.artifacts}, dest)
            removed = remove_stale_temporaries({dest / parent for parent in parents} | {dest / PREP_DIR}, resumable)
            record = PullRecord(dest)
            moved = _transfer(store, dest, share, record, jobs, on_bytes, on_file)
            for folder in folders_to_sync(dest, share.artifacts):
                fsync_path(folder)
            install_derived(dest, derived_files(snapshot.manifest, share.artifacts))
            tokenizer = install_tokenizer(store, dest, snapshot.manifest)
            leftover = sorted(previous - named) if previous is not None else []
            pruned = prune(dest, leftover, named) if prune_old else (0, 0)  # only once all of it is in place
            left = 0 if prune_old else sum(1 for path in leftover if os.path.lexists(os.path.join(dest, path)))
            record.compact(named)
            write_share_record(dest, ShareRecord(snapshot.id, ShareSpec(rank, world_size, formats)))
            crash_point("pull.before_manifest")
            write_manifest(dest, snapshot.raw)  # last: its presence means the pull completed
    except OSError as exc:
        raise failure(exc, exc.filename or dest, f"{exc.filename or dest}: {exc.strerror or exc}") from None
    return PullResult(
        snapshot_id=snapshot.id, dest=dest, share=share,
        files_copied=len(moved.copied), bytes_copied=sum(a.size for a in moved.copied),
        files_reused=len(moved.reused), bytes_reused=sum(a.size for a in moved.reused), files_rehashed=moved.rehashed,
        files_pruned=pruned[0], bytes_pruned=pruned[1], files_left=left,
        prune_warning=problem if prune_old and previous is None else None,
        temporaries_removed=removed, seconds=time.perf_counter() - started,
        ranked=rank is not None, files_resumed=moved.resumed[0], bytes_resumed=moved.resumed[1], tokenizer=tokenizer,
    )
