"""Check a pulled snapshot on disk: every artifact present with the right size and SHA-256.

Also home of what `prep pull` shares with verification: hashing a file while proving it did
not change underneath, and a small interruptible pool.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prep.hashing import Digest
from prep.store.snapshots import Snapshot
from prep.transfer.derived import derived_files
from prep.transfer.held import ShareSpec, choose_share, read_share_record
from prep.transfer.paths import TOKENIZER_NAME
from prep.transfer.shares import PREP_DIR as PREP_DIR
from prep.transfer.shares import TEMP_MARKER as TEMP_MARKER
from prep.transfer.shares import Artifact, Share, artifact_folders, artifacts_of, check_paths, share_of, stamp

REPORT_SCHEMA = "prep.verify-report/2"
DIGEST_TAG = b"prep.verify-digest/1\n"
READ_SIZE = 1 << 20  # >= 1 MiB so hashlib releases the GIL for most of the work
DEFAULT_JOBS = 8

ByteCounter = Callable[[int], None]
FileDone = Callable[["Artifact"], None]
Item = TypeVar("Item")
Result = TypeVar("Result")


class Cancelled(Exception):
    """Raised inside workers once the pool has been told to stop."""


# ---------------------------------------------------------------- hashing


@dataclass(frozen=True)
class FileHash:
    """A file's digest and whether its stamp (size, mtime, ctime, inode, device) moved while it was read."""

    digest: Digest
    changed: bool


def hash_file(path: str | Path, on_bytes: ByteCounter | None = None, stop: threading.Event | None = None) -> FileHash:
    """SHA-256 a regular file in 1 MiB reads; raises OSError when it cannot be opened or read.

    O_NONBLOCK keeps a FIFO planted under an artifact's name from blocking the open.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_file_type(before.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    with io.FileIO(fd, "r", closefd=True) as handle:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        hasher = hashlib.sha256()
        buffer = bytearray(READ_SIZE)
        view = memoryview(buffer)
        size = 0
        while count := handle.readinto(buffer):
            hasher.update(view[:count])
            size += count
            if on_bytes is not None:
                on_bytes(count)
            if stop is not None and stop.is_set():
                raise Cancelled()
        after = os.stat(path)
    # The whole stamp, ctime included: a write into bytes already hashed, the mtime set back,
    # would otherwise leave a digest of the old bytes recorded against the new file's stamp.
    changed = stamp(before) != stamp(after) or size != after.st_size
    return FileHash(Digest(hasher.hexdigest(), size), changed)


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


class ByteTally:
    """A thread-safe running total of bytes processed, forwarded to an optional callback."""

    def __init__(self, forward: ByteCounter | None = None) -> None:
        self.total = 0
        self._forward = forward
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.total += count
        if self._forward is not None:
            self._forward(count)


def run_parallel(
    work: Callable[[Item, threading.Event], Result],
    items: Sequence[Item],
    jobs: int,
    on_done: Callable[[Item], None] | None = None,
) -> list[Result]:
    """Run `work` over items on `jobs` threads, results in item order, calling `on_done` after
    each; the first error (or Ctrl-C) stops the other workers early, then it is raised.

    Workers take the next index from a shared counter: no future per item (those cost about
    40 us each, 4 s for 100,000 files)."""
    stop = threading.Event()
    lock = threading.Lock()
    pending = iter(range(len(items)))
    results: dict[int, Result] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        while not stop.is_set():
            with lock:
                index = next(pending, None)
            if index is None:
                return
            try:
                results[index] = work(items[index], stop)
                if on_done is not None:
                    on_done(items[index])
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)
                stop.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(max(1, jobs), len(items)))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stop.set()
        for thread in threads:
            if thread.ident is not None:
                thread.join()
    if errors:
        raise next((error for error in errors if not isinstance(error, Cancelled)), errors[0])
    return [results[index] for index in range(len(items))]


# ---------------------------------------------------------------- verification


@dataclass(frozen=True)
class Problem:
    """One thing wrong under DEST, named by its path and kind."""

    path: str
    kind: str
    detail: str
    expected_size: int | None = None
    actual_size: int | None = None
    expected_sha256: str | None = None
    actual_sha256: str | None = None
    found_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


PROBLEM_KINDS = ("missing", "wrong-size", "wrong-hash", "unreadable", "changed-during-read", "extra", "renamed")


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of one verification run."""

    snapshot_id: str
    dest: Path
    quick: bool
    share: Share
    ranked: bool
    problems: tuple[Problem, ...]
    bytes_read: int
    seconds: float
    from_record: bool = False  # the share came from DEST/.prep/share.json, not from flags

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def matched(self) -> list[Artifact]:
        """Artifacts of the share with no problem reported against them."""
        bad = {problem.path for problem in self.problems}
        return [artifact for artifact in self.share.artifacts if artifact.path not in bad]

    @property
    def digest(self) -> str | None:
        """The verification digest, only for a full verification that passed."""
        if self.quick or self.problems:
            return None
        return verification_digest(self.snapshot_id, self.share.artifacts)

    def to_json(self) -> dict[str, Any]:
        counts = {kind: sum(1 for p in self.problems if p.kind == kind) for kind in PROBLEM_KINDS}
        return {
            "schema": REPORT_SCHEMA,
            "snapshot": self.snapshot_id,
            "dest": str(self.dest),
            "mode": "quick" if self.quick else "full",
            "rank": self.share.rank if self.ranked else None,
            "world_size": self.share.world_size if self.ranked else None,
            "formats": list(self.share.formats) if self.share.formats is not None else None,
            "share_from": "record" if self.from_record else "flags",
            "warnings": [self.share.warning] if self.share.warning else [],
            "ok": self.ok,
            "expected": {"files": len(self.share.artifacts), "bytes": self.share.size},
            "matched": {"files": len(self.matched), "bytes": sum(a.size for a in self.matched)},
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 6),
            "counts": {kind: count for kind, count in counts.items() if count},
            "problems": [problem.to_json() for problem in self.problems],
            "digest": self.digest,
        }


def verification_digest(snapshot_id: str, artifacts: Iterable[Artifact]) -> str:
    """SHA-256 hex over the tag line, the snapshot id, and each `path NUL sha256 LF` sorted
    by the path's UTF-8 bytes (see docs/pull-verify.md): one value every node can compare."""
    hasher = hashlib.sha256(DIGEST_TAG + snapshot_id.encode() + b"\n")
    for artifact in sorted(artifacts, key=lambda a: a.path.encode()):
        hasher.update(artifact.path.encode() + b"\0" + artifact.sha256.encode() + b"\n")
    return hasher.hexdigest()


def _check_artifact(
    dest: Path, artifact: Artifact, quick: bool, on_bytes: ByteCounter | None, stop: threading.Event
) -> Problem | None:
    def problem(kind: str, detail: str, actual_size: int | None = None, actual_sha256: str | None = None) -> Problem:
        return Problem(artifact.path, kind, detail, expected_size=artifact.size, actual_size=actual_size,
                       expected_sha256=artifact.sha256 if actual_sha256 else None, actual_sha256=actual_sha256)

    path = os.path.join(dest, artifact.path)
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return problem("unreadable", "dangling symlink") if os.path.lexists(path) else problem("missing", "not found")
    except OSError as exc:
        return problem("unreadable", exc.strerror or str(exc))
    if not stat.S_ISREG(info.st_mode):
        return problem("unreadable", f"not a regular file ({_file_type(info.st_mode)})")
    if info.st_size != artifact.size:
        return problem("wrong-size", f"{info.st_size} bytes, expected {artifact.size}", actual_size=info.st_size)
    if quick:
        return None
    try:
        result = hash_file(path, on_bytes, stop)
    except OSError as exc:
        return problem("unreadable", exc.strerror or str(exc))
    if result.changed:
        return problem("changed-during-read", "size, mtime, ctime or inode moved while hashing", result.digest.size)
    if result.digest.sha256 != artifact.sha256:
        return problem("wrong-hash", "content differs", result.digest.size, result.digest.sha256)
    return None


def find_extras(dest: Path, named: set[str]) -> list[Problem]:
    """Entries inside the artifact folders that the snapshot does not name (DEST/.prep/ is
    never looked at). Symlinks to folders are reported, not followed."""
    problems: list[Problem] = []
    folders = {path.rsplit("/", 1)[0] for path in named if "/" in path}
    containers = {"/".join(f.split("/")[: i + 1]) for f in folders for i in range(f.count("/") + 1)}
    for top in artifact_folders(named):
        root = dest / top
        if not os.path.lexists(root):
            continue
        if not root.is_dir():
            problems.append(Problem(top, "extra", "a file where the snapshot has a folder"))
            continue
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda exc: _walk_error(dest, exc, problems)):
            rel_dir = Path(dirpath).relative_to(dest).as_posix()
            for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
                rel = f"{rel_dir}/{name}"
                if rel not in named and rel not in containers:
                    problems.append(Problem(rel, "extra", "not named by the snapshot"))
    return problems


def _walk_error(dest: Path, exc: OSError, problems: list[Problem]) -> None:
    where = Path(exc.filename).relative_to(dest).as_posix() if exc.filename else "?"
    problems.append(Problem(where, "unreadable", f"cannot list folder: {exc.strerror or exc}"))


def _pair_renames(dest: Path, problems: list[Problem], share: Share) -> list[Problem]:
    """Turn a missing artifact plus an extra file with its exact bytes into one `renamed`."""
    wanted = {a.path: a for a in share.artifacts}
    missing = {(wanted[p.path].size, wanted[p.path].sha256): p for p in problems
               if p.kind == "missing" and p.path in wanted}  # a derived file is never renamed
    sizes = {size for size, _ in missing}
    paired: set[int] = set()
    renamed: list[Problem] = []
    for extra in [p for p in problems if p.kind == "extra" and TEMP_MARKER not in p.path.rpartition("/")[2]]:
        candidate = dest / extra.path  # a temporary (a killed pull's partial) is never the artifact
        try:
            if not candidate.is_file() or candidate.stat().st_size not in sizes:
                continue
            found = hash_file(candidate)
        except OSError:
            continue
        original = missing.pop((found.digest.size, found.digest.sha256), None)
        if original is None or found.changed:
            continue
        paired.update((id(original), id(extra)))
        renamed.append(Problem(original.path, "renamed", f"its bytes are at {extra.path}",
                               expected_size=found.digest.size, found_at=extra.path))
    return [p for p in problems if id(p) not in paired] + renamed


def verify(
    snapshot: Snapshot,
    dest: Path,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    formats: tuple[str, ...] | None = None,
    jobs: int = DEFAULT_JOBS,
    quick: bool = False,
    on_bytes: ByteCounter | None = None,
    on_file: FileDone | None = None,
    use_record: bool = True,
) -> VerifyResult:
    """Check `dest` against the snapshot (or one rank's share of it, of some formats): the share
    DEST/.prep/share.json records when it is about this snapshot (`use_record`; flags that
    disagree are a UsageError), else the flags'. Never raises for what it finds on disk, only
    for a refused manifest or bad arguments."""
    started = time.perf_counter()
    counter = ByteTally(on_bytes)
    spec, from_record = planned_share(snapshot, dest, rank, world_size, formats, use_record)
    everything = artifacts_of(snapshot.manifest)
    check_paths((artifact.path for artifact in everything), dest, snapshot.id)
    share = share_of(everything, spec.rank, spec.world_size, spec.formats, snapshot.id)
    derived = [file.artifact for file in derived_files(snapshot.manifest, share.artifacts)]
    ordered = sorted(share.artifacts, key=lambda a: (-a.size, a.path)) + derived + carried(snapshot.manifest)
    found = run_parallel(lambda a, stop: _check_artifact(dest, a, quick, counter.add, stop), ordered, jobs, on_file)
    problems = [problem for problem in found if problem is not None]
    problems += find_extras(dest, {artifact.path for artifact in everything + derived})  # never in DEST/.prep/
    if not quick:
        problems = _pair_renames(dest, problems, share)
    return VerifyResult(
        snapshot_id=snapshot.id,
        dest=dest,
        quick=quick,
        share=share,
        ranked=spec.rank is not None,
        problems=tuple(sorted(problems, key=lambda p: (p.path, p.kind))),
        bytes_read=counter.total,
        seconds=time.perf_counter() - started,
        from_record=from_record,
    )


def carried(manifest: Mapping[str, Any]) -> list[Artifact]:
    """DEST's copy of the files a snapshot carries besides its shards (its tokenizer file, where the
    snapshot names it), checked like its artifacts."""
    tokenizer = manifest["tokenizer"]
    if "object" not in tokenizer:
        return []
    size = tokenizer.get("bytes", -1)  # a manifest naming the object without its size matches no copy
    return [Artifact(f"{PREP_DIR}/{TOKENIZER_NAME}", "tokenizer", -1, int(size), str(tokenizer["sha256"]))]


def planned_share(snapshot: Snapshot, dest: Path, rank: int | None, world_size: int | None,
                  formats: tuple[str, ...] | None, use_record: bool = True) -> tuple[ShareSpec, bool]:
    """The share verify checks and whether DEST's share record chose it (see `verify`)."""
    flags = ShareSpec(rank, world_size, formats)
    return choose_share(read_share_record(dest), snapshot.id, flags, dest) if use_record else (flags, False)
