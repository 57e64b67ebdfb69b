"""Input discovery: expand paths/globs/folders (local or s3://), name each file relative to the
common parent of all inputs, hash contents, and open byte streams (decompressing .gz/.zst)."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import os
import posixpath
import shutil
import socket
import stat as file_mode
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from prep.errors import ConfigError, InputError
from prep.inputs.zstd import open_zstd
from prep.machinecache import cache_root
from prep.store.layout import OBJECTS_PREFIX, leases_prefix
from prep.store.marker import MARKER_KEY

READ_CHUNK = 4 << 20
SPOOL_HEADROOM = 1 << 30  # S3 inputs are spooled only while this much disk stays free
_JSONL = (".jsonl", ".ndjson", ".json")
_TEXT = (".txt", ".text", ".md")
_COMPRESSED = (".gz", ".zst")
_MAGIC = "*?["  # a pattern holding one of these is a glob
_DATASET_DICT = "dataset_dict.json"  # what `datasets` writes beside the split folders of a DatasetDict
# A folder holding one of these is a prep store (a build writes its lease before it lists inputs):
# its records are never inputs, even when the store sits inside a corpus folder.
_STORE_SIGNS = (MARKER_KEY, leases_prefix("build"), OBJECTS_PREFIX)


@dataclass(frozen=True)
class SourceFile:
    """One input file: where to read it, its recorded relative path, size and content hash."""

    location: str
    rel: str
    size: int
    format: str
    sha256: str = ""
    etag: str | None = None
    version_id: str | None = None
    # Local files: (size, mtime, ctime) when listed, checked again after reading
    # (a rewrite that sets the mtime back still moves the ctime); never recorded in manifests.
    stamp: tuple[int, ...] = ()
    stamp_host: str = ""  # the host the stamp was read on (`check_unchanged` compares less elsewhere)

    @property
    def compressed(self) -> bool:
        return self.location.endswith(_COMPRESSED)

    def to_json(self) -> dict[str, object]:
        return {"path": self.rel, "size": self.size, "sha256": self.sha256}


def detect_format(name: str, declared: str) -> str | None:
    """The reader for a file name: the declared format, or by extension under 'auto'."""
    stem = name
    for suffix in _COMPRESSED:
        stem = stem.removesuffix(suffix)
    if name.endswith(".arrow"):
        return "hf"
    if declared != "auto":
        return declared
    if stem.endswith(_JSONL):
        return "jsonl"
    if stem.endswith(".parquet"):
        return "parquet"
    if stem.endswith(_TEXT):
        return "text"
    return None


def _hf_files(folder: Path) -> list[Path]:
    """The Arrow files of a dataset saved with `datasets`' save_to_disk, in their recorded order."""
    import json

    state = folder / "state.json"
    try:
        names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # json recurses per level
        raise InputError(f"{folder}: not a dataset saved with save_to_disk ({state.name}: {exc})") from None
    # names of files in the folder, as datasets writes them: never a path that leads out of it
    bad = [name for name in names if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name]
    if bad or not names:
        problem = f"a filename is {bad[0]!r}, not a file name" if bad else "_data_files lists no files"
        raise InputError(f"{folder}: not a dataset saved with save_to_disk ({state.name}: {problem})")
    return [folder / name for name in names]


def _listed_as_data(name: str) -> bool:
    """Whether a file found by walking a folder (or listing a prefix) is read: not hidden, and
    named like a format prep reads (so `_SUCCESS` and `.crc` files are passed over)."""
    return not name.startswith(".") and detect_format(name, "auto") is not None


def _is_store(folder: str | Path) -> bool:
    """Whether a local folder is a prep store: its marker, or what every build writes there."""
    return any(os.path.exists(os.path.join(folder, sign)) for sign in _STORE_SIGNS)


def _glob_matches(base_dir: Path, pattern: Path) -> list[Path]:
    """A glob's matches (a relative one's folder taken literally, wildcards and all), less those
    inside a prep store below the glob's folder and those reached again through a symlink loop
    (a recursive glob follows linked folders, round a loop some 40 times)."""
    parts = pattern.parts
    wild = next((index for index, part in enumerate(parts) if any(ch in part for ch in _MAGIC)), len(parts))
    root = base_dir.joinpath(*parts[:wild])
    spelled = str(pattern) if pattern.is_absolute() else os.path.join(glob.escape(str(base_dir)), pattern)
    stores: dict[Path, bool] = {}
    reals: dict[Path, str] = {}
    kept: list[Path] = []
    for match in map(Path, glob.glob(spelled, recursive=True)):
        chain = [match.parent, *match.parent.parents]
        chain = chain[:chain.index(root) + 1] if root in chain else []
        for folder in chain:
            if folder not in stores:
                stores[folder], reals[folder] = _is_store(folder), os.path.realpath(folder)
        if not any(stores[folder] for folder in chain) and len({reals[f] for f in chain}) == len(chain):
            kept.append(match)
    return kept


def _unreadable_folder(exc: OSError) -> None:
    """Fail on a folder the walk cannot list (os.walk would pass over it, and its files with it)."""
    raise InputError(f"{exc.filename}: cannot read input folder: {exc.strerror}")


def _walk(folder: Path) -> Iterator[Path]:
    """The data files below a folder in name order, those of a `datasets` save folder as it
    records them, passing over hidden folders and prep stores."""
    for dirpath, dirnames, filenames in os.walk(folder, onerror=_unreadable_folder):
        if _DATASET_DICT in filenames:
            splits = sorted(d for d in dirnames if os.path.isfile(os.path.join(dirpath, d, "state.json")))
            raise InputError(f"{dirpath}: a DatasetDict saved with save_to_disk; name the folders of the "
                             f"splits to read ({', '.join(splits) or 'none found'})")
        visible = sorted(d for d in dirnames if not d.startswith(".") and not _is_store(os.path.join(dirpath, d)))
        saved = [d for d in visible if os.path.isfile(os.path.join(dirpath, d, "state.json"))]
        for name in saved:
            yield from _hf_files(Path(dirpath, name))
        dirnames[:] = [d for d in visible if d not in saved]
        yield from (Path(dirpath, name) for name in sorted(filenames) if _listed_as_data(name))


def _expand_local(pattern: str, base_dir: Path, declared: str) -> list[Path]:
    """The local files a pattern (a file, folder, `datasets` save folder or glob) names."""
    path = Path(pattern).expanduser()
    full = path if path.is_absolute() else base_dir / path
    wild = any(ch in pattern for ch in _MAGIC)
    files: list[Path] = []
    matches = list(_glob_matches(base_dir, path)) if wild else [full]
    if wild and not matches and os.path.lexists(full):  # like a shell: a pattern matching nothing is its own name
        matches = [full]
    for match in matches:
        if match.is_dir():
            if declared == "hf" or (match / "state.json").is_file():
                files.extend(_hf_files(match))
            elif not _is_store(match):
                files.extend(_walk(match))
        else:  # a glob's dangling symlink too: it fails like a walked folder's, never passed over
            files.append(match)
    return files


def discover(paths: tuple[str, ...], base_dir: Path, declared: str) -> list[SourceFile]:
    """Every input file named by `paths`, sorted by relative path; hashes are filled later."""
    # location, namespace path, size, etag, version, stamp
    located: list[tuple[str, str, int, str | None, str | None, tuple[int, ...]]] = []
    for pattern in paths:
        if pattern.startswith("s3://"):
            from prep.storage.s3 import list_objects

            objects = list_objects(pattern)
            if pattern.endswith("/"):  # a prefix is read like a local folder: data files only
                objects = [o for o in objects if _listed_as_data(posixpath.basename(o.key))]
            if not objects:
                raise ConfigError(f"input.paths: no objects match {pattern!r}")
            located.extend((o.url, f"/{o.bucket}/{o.key}", o.size, o.etag, o.version_id, ()) for o in objects)
            continue
        files = _expand_local(pattern, base_dir, declared)
        if not files:
            raise ConfigError(f"input.paths: no files match {pattern!r} (relative to {base_dir})")
        for file in files:
            try:
                stat = file.stat()
            except OSError as exc:
                raise InputError(f"{file}: cannot read input file: {exc.strerror}") from None
            if not file_mode.S_ISREG(stat.st_mode):  # a FIFO or a device would be read forever
                raise InputError(f"{file}: not a regular file; an input must be a file (or a folder of them)")
            located.append((str(file.absolute()), file.absolute().as_posix(), stat.st_size, None, None,
                            local_stamp(stat)))
    if not located:
        raise ConfigError("input.paths: no input files")
    parents = [posixpath.dirname(ns) for _, ns, *_ in located]
    common = posixpath.commonpath(parents)
    sources: dict[str, SourceFile] = {}
    host = socket.gethostname()  # where the local stamps were read
    for location, ns, size, etag, version, stamp in located:
        rel = posixpath.relpath(ns, common)
        _require_utf8_name(location, rel)
        fmt = detect_format(rel, declared)
        if fmt is None:
            raise ConfigError(f"{location}: cannot tell the input format from the name; set input.format")
        sources[rel] = SourceFile(location, rel, size, fmt, etag=etag, version_id=version, stamp=stamp,
                                  stamp_host=host if stamp else "")
    return [sources[rel] for rel in sorted(sources)]


def _require_utf8_name(location: str, rel: str) -> None:
    """Fail on a name a snapshot cannot record: manifests are UTF-8 JSON, and a local name that is
    not UTF-8 reaches here as a str holding lone surrogates (os.fsdecode's escapes)."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(location).decode("utf-8", "backslashreplace")
        raise InputError(f"{shown}: the file name is not valid UTF-8; rename it (snapshots record names as UTF-8)") from None


def local_copy(source: SourceFile) -> Path | None:
    """A local file holding the input's bytes: the file itself, or the spooled copy of an S3
    input (present when this machine hashed it); None when only S3 has it."""
    if not source.location.startswith("s3://"):
        return Path(source.location)
    if source.sha256:
        spooled = spool_path(source.sha256)
        try:
            if spooled.stat().st_size == source.size:
                return spooled
        except FileNotFoundError:
            pass
    return None


def open_raw(source: SourceFile) -> BinaryIO:
    """The file's stored bytes (still compressed)."""
    if source.location.startswith("s3://"):
        from prep.storage.s3 import S3Object, open_object

        spooled = local_copy(source)
        if spooled is not None:
            return open(spooled, "rb")
        # pinned to the version (or ETag) that was hashed, so every task reads those bytes
        return open_object(S3Object.at(source.location, source.size, source.etag, source.version_id))
    try:
        return open(source.location, "rb")
    except OSError as exc:
        raise InputError(f"{source.location}: cannot read input file: {exc.strerror}") from None


def open_decoded(source: SourceFile) -> BinaryIO:
    """The file's content, decompressing .gz and .zst transparently."""
    raw = open_raw(source)
    if source.location.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if source.location.endswith(".zst"):
        return open_zstd(raw, source.location, READ_CHUNK)
    return raw


def spool_path(sha256: str) -> Path:
    """Where this machine keeps a copy of an S3 input read during hashing, named by content."""
    return cache_root() / "inputs" / sha256


def _spool_fits(size: int, folder: Path) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(folder).free > size + SPOOL_HEADROOM


def _hash_s3(source: SourceFile, spool: bool) -> SourceFile:
    """Hash an S3 input in one read, teeing it into the local spool when it fits on disk, so
    tasks on this machine read the spool instead of reading S3 a second time."""
    from prep.storage.s3 import S3Object, hash_object

    obj = S3Object.at(source.location, source.size, source.etag, source.version_id)
    folder = cache_root() / "inputs"
    if not spool or not _spool_fits(source.size, folder):
        read, sha256 = hash_object(obj)
    else:
        temp = folder / f".{uuid.uuid4().hex}.part"
        try:
            with open(temp, "wb") as sink:
                read, sha256 = hash_object(obj, sink)
            os.replace(temp, spool_path(sha256))  # named by the hash of exactly the bytes written
        finally:
            temp.unlink(missing_ok=True)
    return dataclasses.replace(source, sha256=sha256, etag=read.etag, version_id=read.version_id)


def release_spool(sources: list[SourceFile]) -> None:
    """Drop the spooled copies of these S3 inputs (once no task needs them)."""
    for source in sources:
        if source.location.startswith("s3://") and source.sha256:
            spool_path(source.sha256).unlink(missing_ok=True)


def hash_source(source: SourceFile, spool: bool = False) -> SourceFile:
    """The same source with the SHA-256 of its stored bytes filled in (`spool`: see _hash_s3)."""
    if source.location.startswith("s3://"):
        return _hash_s3(source, spool)
    hasher = hashlib.sha256()
    size = 0
    try:
        with open_raw(source) as stream:
            while chunk := stream.read(READ_CHUNK):
                hasher.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise InputError(f"{source.location}: cannot read input file: {exc}") from None
    if size != source.size:
        raise InputError(f"{source.location}: changed while being hashed ({source.size} -> {size} bytes)")
    return SourceFile(source.location, source.rel, size, source.format, hasher.hexdigest(),
                      source.etag, source.version_id, source.stamp, source.stamp_host)


SHARED_STAMP = 2
"""How much of a stamp another machine compares (size and mtime): a shared filesystem may show
each client a ctime of its own, so only the host that listed a file compares its ctime."""


def local_stamp(stat: os.stat_result) -> tuple[int, ...]:
    """What a local input is checked against after reading: size, mtime and ctime. Not the inode
    or device: a Ray worker on another machine sees a shared mount under a device number (and on
    some filesystems inode numbers) of its own; replacing the file moves the ctime anyway."""
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def check_unchanged(source: SourceFile) -> None:
    """Fail when a local input changed since it was hashed (its bytes would not match the
    recorded SHA-256, and a cached result keyed on that hash would be wrong)."""
    if source.location.startswith("s3://"):
        return  # reads of S3 inputs are pinned to the version (or ETag) that was listed
    try:
        stat = os.stat(source.location)
    except OSError as exc:
        raise InputError(f"{source.location}: cannot read input file: {exc.strerror}") from None
    host = socket.gethostname()
    if source.stamp_host in ("", host):
        if local_stamp(stat) != source.stamp:  # the size is in it
            raise InputError(f"{source.location}: changed during the build; rerun to pick up the new content")
    elif local_stamp(stat)[:SHARED_STAMP] != source.stamp[:SHARED_STAMP]:
        raise InputError(f"{source.location}: changed during the build, or differs on host {host} (size and "
                         f"mtime there are not those host {source.stamp_host} listed); rerun to pick up the new "
                         "content, or make the file the same on every node")


def input_version(sources: list[SourceFile]) -> str:
    """One id over every input's relative path, size and hash."""
    from prep.manifest import canonical

    return "sha256:" + hashlib.sha256(canonical.dumps([s.to_json() for s in sources])).hexdigest()
