"""One snapshot as a token stream: its `.bin` shards in shard order, checked before they are read.

A source is a pulled folder (`DEST` of `prep pull`, with `DEST/.prep/manifest.json`) or a snapshot
spec resolved in a local store. Every shard file is hashed against the manifest the first time a
process opens it (remembered by its path, its stat stamp and the SHA-256 it matched, so a file
changed afterwards is hashed again), unless pull's record (`DEST/.prep/verified.jsonl`) says it proved exactly those bytes and
the file's stat stamp has not changed since; a mismatch is an IntegrityError naming the file, and
nothing from it is served.

Tokens are read by position from the checked files, held open by descriptor (prep.data.pread): a file
cut short while the reader runs, or a disk that fails to return its bytes, is a one-line prep error
naming it, never a SIGBUS.
"""

from __future__ import annotations

import os
import resource
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any

import numpy as np

from prep.data.pread import Pieces, TokenFile, fill, plan_rows, read_in_groups, read_pieces
from prep.errors import IntegrityError, NotFoundError, PrepError, StorageIOError, UsageError
from prep.formats.megatron import parse_index
from prep.hashing import digest_file
from prep.regular import open_regular
from prep.storage.backend import Store
from prep.store import cas
from prep.store.snapshots import Snapshot, read_manifest_file, resolve
from prep.transfer.shares import PullRecord, Stamp, stamp

PULLED_MANIFEST = Path(".prep") / "manifest.json"
# Shard files a source holds open at once. A 20 TB snapshot has about 80,000 shards, and a process
# may hold only its descriptor limit open (often 1024): past this, the least recently used is closed.
MAX_OPEN_SHARDS = 256

# (file, the SHA-256 it hashed to) -> its stamp then. The ctime is in it: a rewrite that sets the
# mtime back still moves the ctime.
_CHECKED: dict[tuple[Path, str], Stamp] = {}


@dataclass(frozen=True)
class Shard:
    """One shard's token file and index, where they are on this machine and what they must hash to."""

    index: int
    bin_path: Path
    bin_sha256: str
    idx_path: Path | None
    idx_sha256: str
    tokens: int
    documents: int
    bin_name: str = ""
    idx_name: str = ""


def _missing(path: Path) -> NotFoundError:
    return NotFoundError(f"{path}: a shard file the snapshot names is missing")


def open_file_budget() -> int:
    """How many shard files a source keeps open: MAX_OPEN_SHARDS, or a quarter of this process's
    descriptor limit when that is lower (a DataLoader worker, a mixture of many sources)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_OPEN_SHARDS if soft == resource.RLIM_INFINITY else max(1, min(MAX_OPEN_SHARDS, soft // 4))


def check_file(path: Path, sha256: str, record: PullRecord | None = None, name: str = "") -> Stamp:
    """Hash `path` against `sha256` once per process (again if the file's stamp changed), unless
    `prep pull` recorded proving exactly these bytes and the file's stat stamp is unchanged; the stamp vouched for."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise _missing(path) from None
    except OSError as exc:
        raise StorageIOError.from_os_error("reading", path, exc) from None
    if not S_ISREG(stat.st_mode):  # a FIFO or a device (say, a symlink to /dev/zero) would be hashed for ever
        raise IntegrityError(f"{path}: not a regular file (a FIFO, a device or a folder); refusing to read it")
    identity = stamp(stat)
    if _CHECKED.get((path, sha256)) == identity:
        return identity
    if record is not None and record.proven(name, stat) == sha256:
        _CHECKED[(path, sha256)] = identity
        return identity
    try:
        digest = digest_file(path)
    except OSError as exc:
        raise StorageIOError.from_os_error("reading", path, exc) from None
    if digest.sha256 != sha256:
        raise IntegrityError(f"{path}: does not match the snapshot (sha256 differs); refusing to read it")
    _CHECKED[(path, sha256)] = identity
    return identity


def open_checked(path: Path, sha256: str, record: PullRecord | None = None, name: str = "", note: str = "",
                 kind: str = "shard") -> TokenFile:
    """`path` checked (check_file) and held open for positional reads of its proven size; refused if
    the file opened is not the one checked (replaced in between)."""
    identity = check_file(path, sha256, record, name)
    try:
        fd = open_regular(path)  # never blocks: a FIFO swapped in since the check is refused
    except FileNotFoundError:
        raise _missing(path) from None
    except OSError as exc:
        raise StorageIOError.from_os_error("opening", path, exc) from None
    try:
        if stamp(os.fstat(fd)) != identity:
            raise IntegrityError(f"{path}: changed while it was being opened; refusing to read it")
    except BaseException:
        os.close(fd)
        raise
    return TokenFile(fd, path, identity[0], note, kind)


class SnapshotSource:
    """A snapshot's token stream: documents (each ending in EOS) concatenated in snapshot order."""

    def __init__(self, snapshot: Snapshot, locate: dict[str, Path], record: PullRecord | None = None) -> None:
        self.snapshot = snapshot
        self.record = record
        manifest = snapshot.manifest
        self.dtype = np.dtype(manifest["tokenizer"]["dtype"]).newbyteorder("<")
        by_shard: dict[int, dict[str, dict[str, Any]]] = {}
        for artifact in manifest["artifacts"]:
            by_shard.setdefault(int(artifact["shard"]), {})[artifact["format"]] = artifact
        if any("bin" not in files for files in by_shard.values()):
            raise UsageError(f"{snapshot.id}: the reader needs the bin format; this snapshot has no .bin for some shards")
        self.shards = [Shard(index, locate[files["bin"]["path"]], files["bin"]["sha256"],
                             locate.get(files["idx"]["path"]) if "idx" in files else None,
                             files["idx"]["sha256"] if "idx" in files else "",
                             int(files["bin"]["size"]) // self.dtype.itemsize, int(files["bin"]["documents"]),
                             files["bin"]["path"], files["idx"]["path"] if "idx" in files else "")
                       for index, files in sorted(by_shard.items())]
        self.token_starts = np.concatenate(([0], np.cumsum([s.tokens for s in self.shards], dtype=np.int64)))
        self.total_tokens = int(self.token_starts[-1])
        self._files: OrderedDict[int, TokenFile] = OrderedDict()  # by shard, opened on first use, LRU first
        self.max_open = open_file_budget()  # shard files kept open at once (a mixture divides it)
        self.bytes_read = 0

    @property
    def id(self) -> str:
        return self.snapshot.id

    @classmethod
    def open(cls, source: str | os.PathLike[str], store: Store | None = None) -> SnapshotSource:
        """A pulled folder, or a snapshot spec (`dataset@ref`, `sha256:...`) in a local `store`."""
        folder = Path(source)
        if folder.is_dir():
            manifest = folder / PULLED_MANIFEST
            if not manifest.exists():
                raise UsageError(f"{folder}: not a pulled snapshot (no {PULLED_MANIFEST}); run prep pull first")
            snapshot = read_manifest_file(manifest)
            return cls(snapshot, {a["path"]: folder / a["path"] for a in snapshot.manifest["artifacts"]},
                       PullRecord(folder))
        if store is None:
            raise UsageError(f"{source}: a snapshot spec needs store=... (or give a pulled folder)")
        snapshot = resolve(store, str(source))
        located: dict[str, Path] = {}
        for artifact in snapshot.manifest["artifacts"]:
            path = store.local_path(cas.object_key(artifact["sha256"]))
            if path is None:
                raise UsageError(f"{store.url}: reading straight from a remote store needs the node-local cache "
                                 "(cache_dir=... and cache_bytes=...), or prep pull the snapshot and give the folder")
            located[artifact["path"]] = path
        return cls(snapshot, located)

    def _file(self, shard: int) -> TokenFile:
        """The shard's `.bin`, checked and held open on first use; the least recently used file is
        closed past the budget (open_file_budget; a later read opens it again: a `stat` and an `open`)."""
        found = self._files.get(shard)
        if found is not None:
            self._files.move_to_end(shard)
            return found
        spec = self.shards[shard]
        found = self._files[shard] = open_checked(spec.bin_path, spec.bin_sha256, self.record, spec.bin_name)
        while len(self._files) > self.max_open:
            self._files.popitem(last=False)[1].close()
        return found

    def _read(self, out: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Fill `out` (rows of out.shape[1] tokens, any integer dtype) from each of `starts`: one
        positional read per run of nearby rows (per shard for a run crossing shards; `_read_parts`),
        then one assignment."""
        reads = plan_rows(self.token_starts, starts, out.shape[1], self.dtype.itemsize)
        fill(out, reads, self._read_parts(reads.pieces), self.dtype)
        self.bytes_read += out.size * self.dtype.itemsize
        return out

    def _read_parts(self, pieces: Pieces) -> list[bytes]:
        """The pieces' bytes, from the shard files: at once, or in turns of the open-file budget."""
        touched = sorted(set(pieces.shards))
        if len(touched) <= self.max_open:
            return self._read_open(touched, pieces)
        return read_in_groups(pieces, self.max_open, self._read_open)

    def _read_open(self, shards: list[int], pieces: Pieces) -> list[bytes]:
        """The pieces, from these shards' files (at most the budget, so all stay open meanwhile)."""
        files = {shard: self._file(shard) for shard in shards}
        try:
            return read_pieces(files, pieces)
        except PrepError:
            self._forget(set(files))
            raise

    def _forget(self, shards: set[int]) -> None:
        """Close these shards' files: after a failed read the next use opens (and checks) them again."""
        for shard in shards:
            file = self._files.pop(shard, None)
            if file is not None:
                file.close()

    def close(self) -> None:
        """Close the shard files held open (a later read opens them again)."""
        self._forget(set(self._files))

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows of `length` tokens starting at each of `starts`, as one (len(starts), length) int64 array."""
        return self._read(np.empty((len(starts), length), dtype=np.int64), np.asarray(starts, dtype=np.int64))

    def tokens(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) of the stream, across shard boundaries when needed."""
        if start < 0 or start + count > self.total_tokens:
            raise IndexError(f"tokens {start}..{start + count} outside 0..{self.total_tokens}")
        row: np.ndarray = self._read(np.empty((1, count), dtype=self.dtype), np.asarray([start], dtype=np.int64))[0]
        return row

    def document_bounds(self) -> np.ndarray:
        """Start offsets of every document in the stream plus the end: (documents + 1,) int64."""
        starts = [np.zeros(0, dtype=np.int64)]
        for spec, base in zip(self.shards, self.token_starts[:-1].tolist()):
            if spec.idx_path is None:
                raise UsageError(f"{self.id}: documents mode needs the .idx files")
            index = open_checked(spec.idx_path, spec.idx_sha256, self.record, spec.idx_name, kind="index")
            try:  # read into memory once, from the descriptor whose file was checked
                lengths = parse_index(index.read(), str(spec.idx_path)).lengths.astype(np.int64)
            finally:
                index.close()
            starts.append(base + np.concatenate(([0], np.cumsum(lengths)[:-1])))
        return np.concatenate([*starts, [self.total_tokens]])
