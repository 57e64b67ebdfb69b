"""A snapshot's artifacts and the folder they land in, as pull and verify see them: read from
the manifest, refused when a path is unsafe, DEST's own files (the `.prep/` folder, temporaries,
the pull lock, the record of proven files), and rank shares (a deterministic, byte-balanced
partition).

Every node computes the same partition from the manifest alone. A share is whole shards: every
selected format of a shard (a Megatron `.bin`, its `.idx`, the WebDataset `.tar`) lands on the
same rank, so a rank never holds a `.tar` without the `.bin` of the same shard.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import json
import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from prep.errors import StorageIOError, UsageError
from prep.formats.units import required_formats, unit_formats, unit_names
from prep.regular import open_regular
from prep.transfer.paths import PREP_DIR as PREP_DIR
from prep.transfer.paths import TEMP_MARKER as TEMP_MARKER
from prep.transfer.paths import check_paths as check_paths

PARTIAL_TAG = "partial-"
LOCK_NAME = "pull.lock"
RECORD_NAME = "verified.jsonl"
IO_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})  # the disk failed, not the command

Stamp = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class Artifact:
    """One file of a snapshot: where it goes under DEST and what its bytes must be."""

    path: str
    format: str
    shard: int
    size: int
    sha256: str

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any]) -> Artifact:
        return cls(
            path=str(entry["path"]),
            format=str(entry["format"]),
            shard=int(entry["shard"]),
            size=int(entry["size"]),
            sha256=str(entry["sha256"]),
        )


@dataclass(frozen=True)
class Unit:
    """Artifacts that must stay on one rank: every selected file of one shard."""

    shard: int
    artifacts: tuple[Artifact, ...]

    @property
    def size(self) -> int:
        return sum(artifact.size for artifact in self.artifacts)

    @property
    def sort_key(self) -> tuple[int, int, str]:
        """Largest first; ties broken by shard index and first path so every node agrees."""
        return (-self.size, self.shard, self.artifacts[0].path)


@dataclass(frozen=True)
class Share:
    """What one rank of `world_size` holds: whole shards of the selected formats (None: all)."""

    rank: int
    world_size: int
    artifacts: tuple[Artifact, ...]
    formats: tuple[str, ...] | None = None
    shards: int = 0  # shards in the selection all ranks share

    @property
    def size(self) -> int:
        return sum(artifact.size for artifact in self.artifacts)

    @property
    def warning(self) -> str | None:
        """Why this share is suspicious (it holds no file), or None."""
        if self.artifacts:
            return None
        shards = f"{self.shards} shard" + ("" if self.shards == 1 else "s")
        return f"rank {self.rank} of {self.world_size} holds no files: {shards} for {self.world_size} ranks"


def artifacts_of(manifest: Mapping[str, Any]) -> list[Artifact]:
    """The artifacts a snapshot manifest lists, in manifest order."""
    return [Artifact.from_manifest(entry) for entry in manifest["artifacts"]]


def artifact_folders(paths: Iterable[str]) -> list[str]:
    """The top-level folders artifact paths live in (e.g. `bin`, `wds`), sorted."""
    return sorted({path.split("/", 1)[0] for path in paths if "/" in path})


# ---------------------------------------------------------------- DEST's own files


def temp_name(final: Path) -> Path:
    """A fresh temporary next to `final`, recognizable as ours by the marker."""
    return final.with_name(f".{final.name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")


def partial_name(final: Path, sha256: str) -> Path:
    """The deterministic name a resumable copy of the object `sha256` to `final` grows under:
    marked as a temporary, so it never looks complete, and recognisable by the next run."""
    return final.with_name(f".{final.name}{TEMP_MARKER}{PARTIAL_TAG}{sha256[:16]}")


def _is_temp(name: str) -> bool:
    return name.startswith(".") and TEMP_MARKER in name


def remove_stale_temporaries(folders: set[Path], keep: Callable[[Path, str], bool] | None = None) -> int:
    """Delete temporaries a killed pull left in these folders, except those `keep(folder, name)`
    accepts (the partial files this run will resume); returns how many."""
    removed = 0
    for folder in sorted(folders):
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if _is_temp(name) and not (keep is not None and keep(folder, name)):
                (folder / name).unlink(missing_ok=True)
                removed += 1
    return removed


def read_own(path: Path, *, follow: bool = True) -> bytes:
    """The bytes of one of DEST's own files (`.prep/manifest.json`, the record, the share
    record), never blocking on a FIFO nor reading a device planted there: anything but a
    regular file (and, unless `follow`, a symlink) is an OSError, as an unreadable file is."""
    with open(open_regular(path, follow=follow), "rb") as handle:
        return handle.read()


def discard(path: Path) -> None:
    """Remove a temporary if it is there; never mask the error that is already propagating."""
    with contextlib.suppress(OSError):
        path.unlink()


def stamp(info: os.stat_result) -> Stamp:
    """What a recorded proof is tied to: size, mtime, ctime, inode and device."""
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def record_line(path: str, sha256: str, numbers: Stamp) -> str:
    """One record line: the file's path, its SHA-256 and the stamp it had when proven."""
    size, mtime, ctime, ino, dev = numbers
    return f"[{json.dumps(path)},{json.dumps(sha256)},{size},{mtime},{ctime},{ino},{dev}]\n"


def _record_rows(lines: list[bytes]) -> list[Any]:
    try:  # all lines whole: one parse
        rows: list[Any] = json.loads(b"[" + b",".join(lines) + b"]")
        return rows
    except ValueError:
        pass
    rows = []
    for line in lines:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def load_record(path: Path) -> tuple[dict[str, tuple[str, Stamp]], int]:
    """The entries of a record and its line count; torn or malformed lines are ignored."""
    try:
        lines = read_own(path).split(b"\n")[:-1]  # a torn last line has no newline
    except OSError:
        return {}, 0
    entries: dict[str, tuple[str, Stamp]] = {}
    for row in _record_rows(lines):
        if type(row) is list and len(row) == 7 and type(row[0]) is str and type(row[1]) is str:
            name, sha, size, mtime, ctime, ino, dev = row
            if all(type(n) is int for n in (size, mtime, ctime, ino, dev)):
                entries[name] = (sha, (size, mtime, ctime, ino, dev))
    return entries, len(lines)


def _open_record(path: Path) -> int:
    """The record, opened to append, never through a symlink or a hard link (pull would append
    wherever it points, or to the other file), nor blocking on a FIFO: anything there but a
    regular file of its own is removed first (pull holds DEST's lock)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO nobody reads
            raise
    else:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return fd
        os.close(fd)
    path.unlink()
    return os.open(path, flags | os.O_EXCL, 0o644)


class PullRecord:
    """DEST/.prep/verified.jsonl: files pull installed or proved by hashing, with the SHA-256
    and stat stamp they had then. An entry counts only while the file's stamp is unchanged.
    Lines are appended as files are proven (so a killed pull keeps them); the record is
    compacted once it has grown to twice the entries worth keeping. Losing it only costs
    re-hashing; it is never fsynced."""

    def __init__(self, dest: Path) -> None:
        self.path = dest / PREP_DIR / RECORD_NAME
        self.entries, self.lines = load_record(self.path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False

    def proven(self, path: str, info: os.stat_result) -> str | None:
        """The SHA-256 recorded for `path` if its stamp still is `info`'s, else None."""
        entry = self.entries.get(path)
        return entry[0] if entry is not None and entry[1] == stamp(info) else None

    def add(self, path: str, sha256: str, info: os.stat_result) -> None:
        numbers = stamp(info)
        line = record_line(path, sha256, numbers).encode()
        with self._lock:
            self.entries[path] = (sha256, numbers)
            if self._closed:  # a copy thread finishing after close(): the record is only advisory
                return
            self.lines += 1
            if self._fd is None:
                self._fd = _open_record(self.path)
            os.write(self._fd, line)

    def close(self) -> None:
        """Stop appending; under the lock, so a copy thread never writes to a closed descriptor
        (whose number the process may already have given to another file)."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def compact(self, keep: set[str]) -> None:
        """Rewrite the record (temporary, rename) with the entries of `keep` only, once it has
        more than twice as many lines; an entry of a path not kept is never wrong, only idle."""
        kept = {path: entry for path, entry in self.entries.items() if path in keep}
        if self.lines <= 2 * len(kept) + 64:
            return
        self.rewrite(kept)
        self.entries, self.lines = kept, len(kept)

    def rewrite(self, kept: dict[str, tuple[str, Stamp]]) -> None:
        """Replace the record with the lines of `kept` (a temporary renamed over it, so a crash
        leaves the old record or the new one whole); later appends go to the new file."""
        temp = temp_name(self.path)
        try:
            with open(temp, "x", encoding="utf-8") as out:
                out.writelines(record_line(path, sha, numbers) for path, (sha, numbers) in kept.items())
            os.replace(temp, self.path)
        finally:
            discard(temp)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class DestLock:
    """An exclusive flock on DEST/.prep/pull.lock: one pull per folder; freed by the kernel
    even when the pull is killed."""

    def __init__(self, dest: Path) -> None:
        self.path = dest / PREP_DIR / LOCK_NAME
        self.handle: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.parent.is_symlink():  # pull's own files would land wherever it points
            raise UsageError(f"{self.path.parent}: a symlink; pull keeps its own files in a {PREP_DIR} folder of DEST")
        try:  # not through a symlink: that would create or lock a file outside DEST
            self.handle = open(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644), "a+b")
        except OSError as exc:
            if exc.errno in IO_ERRNOS:  # a read-only or full filesystem: exit 4, as everywhere
                raise StorageIOError.from_os_error("writing", self.path, exc) from None
            raise UsageError(f"{self.path}: cannot open the pull lock: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise UsageError(f"{self.path.parent.parent}: another prep pull is writing into this folder") from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.handle is not None:
            self.handle.close()


# ---------------------------------------------------------------- rank shares


def group_units(artifacts: Iterable[Artifact]) -> list[Unit]:
    """Group artifacts into units, one per shard (all its selected formats), members sorted by path."""
    members: dict[int, list[Artifact]] = {}
    for artifact in artifacts:
        members.setdefault(artifact.shard, []).append(artifact)
    return [Unit(shard=shard, artifacts=tuple(sorted(group, key=lambda a: a.path))) for shard, group in members.items()]


def parse_formats(values: Iterable[str]) -> tuple[str, ...] | None:
    """`--formats` values (repeatable, comma lists) as sorted unit names; None when none given."""
    names = {name.strip() for value in values for name in value.split(",") if name.strip()}
    unknown = sorted(names - set(unit_names()))
    if unknown:
        raise UsageError(f"--formats: unknown format {unknown[0]!r}: expected {' or '.join(unit_names())}")
    return tuple(sorted(names)) if names else None


def select_formats(artifacts: Sequence[Artifact], formats: tuple[str, ...] | None, source: str) -> list[Artifact]:
    """The artifacts of the selected units (`bin` brings its `idx`); all when `formats` is None.
    A selected format the snapshot lacks is a UsageError naming what it has."""
    if formats is None:
        return list(artifacts)
    wanted = {fmt for name in formats for fmt in unit_formats(name)}
    present = {artifact.format for artifact in artifacts}
    lacking = [name for name in formats if not set(required_formats(name)) <= present]
    if lacking:
        has = ", ".join(name for name in unit_names() if set(required_formats(name)) <= present) or "none"
        raise UsageError(f"--formats {lacking[0]}: {source} has no {lacking[0]} artifacts (it has: {has})")
    return [artifact for artifact in artifacts if artifact.format in wanted]


def check_rank(rank: int, world_size: int) -> None:
    """Reject a rank outside 0..world_size-1 or a world size below 1."""
    if world_size < 1:
        raise UsageError(f"--world-size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise UsageError(f"--rank must be between 0 and {world_size - 1}, got {rank}")


def partition(artifacts: Sequence[Artifact], world_size: int, formats: tuple[str, ...] | None = None) -> list[Share]:
    """Split artifacts into `world_size` shares of whole shards: shards go largest first to the
    least-loaded rank (lowest rank on ties), so max load <= total/world_size + largest shard."""
    check_rank(0, world_size)
    loads: list[tuple[int, int]] = [(0, rank) for rank in range(world_size)]
    assigned: list[list[Artifact]] = [[] for _ in range(world_size)]
    units = group_units(artifacts)
    for unit in sorted(units, key=lambda u: u.sort_key):
        load, rank = heapq.heappop(loads)
        assigned[rank].extend(unit.artifacts)
        heapq.heappush(loads, (load + unit.size, rank))
    return [
        Share(rank=rank, world_size=world_size, artifacts=tuple(sorted(items, key=lambda a: a.path)), formats=formats,
              shards=len(units))
        for rank, items in enumerate(assigned)
    ]


def share_of(artifacts: Sequence[Artifact], rank: int | None, world_size: int | None,
             formats: tuple[str, ...] | None = None, source: str = "the snapshot") -> Share:
    """The share of `rank` among the artifacts of `formats`; with no rank and world size, all
    of them as one share."""
    selected = select_formats(artifacts, formats, source)
    if rank is None and world_size is None:
        return Share(rank=0, world_size=1, artifacts=tuple(sorted(selected, key=lambda a: a.path)), formats=formats,
                     shards=len({artifact.shard for artifact in selected}))
    if rank is None or world_size is None:
        raise UsageError("--rank and --world-size must be given together")
    check_rank(rank, world_size)
    return partition(selected, world_size, formats)[rank]
