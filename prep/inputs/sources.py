"""Input discovery: expand paths/globs/folders (local or s3://), name each file relative to the
common parent of all inputs, hash contents, and open byte streams (decompressing .gz/.zst)."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import io
import os
import posixpath
import shutil
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol, cast

from prep.cache import cache_root
from prep.errors import ConfigError, InputError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

READ_CHUNK = 4 << 20
LINE_BLOCK = 8 << 20  # lines are split out of blocks this large (readline per line is slower)
SPOOL_HEADROOM = 1 << 30  # S3 inputs are spooled only while this much disk stays free
_JSONL = (".jsonl", ".ndjson", ".json")
_TEXT = (".txt", ".text", ".md")
_COMPRESSED = (".gz", ".zst")


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
    mtime_ns: int = 0  # local files: checked again after reading, never recorded in manifests

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
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{folder}: not a dataset saved with save_to_disk ({state.name}: {exc})") from None
    return [folder / name for name in names]


def _listed_as_data(name: str) -> bool:
    """Whether a file found by walking a folder (or listing a prefix) is read: not hidden, and
    named like a format prep reads (so `_SUCCESS` and `.crc` files are passed over)."""
    return not name.startswith(".") and detect_format(name, "auto") is not None


def _expand_local(pattern: str, base_dir: Path, declared: str) -> list[Path]:
    path = Path(pattern).expanduser()
    full = path if path.is_absolute() else base_dir / path
    if any(ch in pattern for ch in "*?["):
        matches = [Path(p) for p in glob.glob(str(full), recursive=True)]
    else:
        matches = [full]
    files: list[Path] = []
    for match in matches:
        if match.is_dir():
            if declared == "hf" or (match / "state.json").is_file():
                files.extend(_hf_files(match))
                continue
            for dirpath, dirnames, filenames in os.walk(match):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                files.extend(Path(dirpath, name) for name in sorted(filenames) if _listed_as_data(name))
        elif match.exists() or not any(ch in pattern for ch in "*?["):
            files.append(match)
    return files


def discover(paths: tuple[str, ...], base_dir: Path, declared: str) -> list[SourceFile]:
    """Every input file named by `paths`, sorted by relative path; hashes are filled later."""
    # location, namespace path, size, etag, version, mtime_ns
    located: list[tuple[str, str, int, str | None, str | None, int]] = []
    for pattern in paths:
        if pattern.startswith("s3://"):
            from prep.storage.s3 import list_objects

            objects = list_objects(pattern)
            if pattern.endswith("/"):  # a prefix is read like a local folder: data files only
                objects = [o for o in objects if _listed_as_data(posixpath.basename(o.key))]
            if not objects:
                raise ConfigError(f"input.paths: no objects match {pattern!r}")
            located.extend((o.url, f"/{o.bucket}/{o.key}", o.size, o.etag, o.version_id, 0) for o in objects)
            continue
        files = _expand_local(pattern, base_dir, declared)
        if not files:
            raise ConfigError(f"input.paths: no files match {pattern!r} (relative to {base_dir})")
        for file in files:
            try:
                stat = file.stat()
            except OSError as exc:
                raise InputError(f"{file}: cannot read input file: {exc.strerror}") from None
            located.append((str(file.absolute()), file.absolute().as_posix(), stat.st_size, None, None, stat.st_mtime_ns))
    if not located:
        raise ConfigError("input.paths: no input files")
    parents = [posixpath.dirname(ns) for _, ns, *_ in located]
    common = posixpath.commonpath(parents)
    sources: dict[str, SourceFile] = {}
    for location, ns, size, etag, version, mtime_ns in located:
        rel = posixpath.relpath(ns, common)
        fmt = detect_format(rel, declared)
        if fmt is None:
            raise ConfigError(f"{location}: cannot tell the input format from the name; set input.format")
        sources[rel] = SourceFile(location, rel, size, fmt, etag=etag, version_id=version, mtime_ns=mtime_ns)
    return [sources[rel] for rel in sorted(sources)]


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
        import zstandard

        frames = _ZstdFrames(raw, source.location)
        # the reader only calls read() and close() of its source
        reader = zstandard.ZstdDecompressor().stream_reader(cast(BinaryIO, frames), read_size=READ_CHUNK,
                                                            read_across_frames=True, closefd=True)
        return io.BufferedReader(_ZstdReader(reader, frames), buffer_size=READ_CHUNK)
    return raw


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # up to 0x184D2A5F: skippable frames (user data the decoder ignores)
_U32 = struct.Struct("<I")
# Frame header bytes after the descriptor byte, by its value: window descriptor (absent for a
# single segment), dictionary id (0, 1, 2 or 4 bytes), frame content size (0/1, 2, 4 or 8 bytes).
_HEADER_REST = tuple((0 if fhd & 0x20 else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if fhd & 0x20 else 0), 2, 4, 8)[fhd >> 6]
                     for fhd in range(256))
_MAGIC, _BLOCK, _UNKNOWN = 0, 1, 2  # what _ZstdFrames expects next after the bytes it skips


# zstandard's decoder returns a stream cut short inside a frame as a shorter output, without an
# error; so the compressed bytes pass through _ZstdFrames, which follows the frame and block
# headers (skipping block data by its size, never decoding it) to tell whether they end on a
# frame boundary, and _ZstdReader asks it at the end of the decompressed data.
class _ZstdFrames:
    """The compressed bytes, passed on unchanged while their frame and block headers are walked."""

    def __init__(self, raw: BinaryIO, location: str) -> None:
        self._raw = raw
        self._location = location
        self._offset = 0  # file offset of the first byte of the next read
        self._skip = 0  # bytes of block data, checksum or skippable payload still to pass
        self._stage = _MAGIC
        self._checksum = False  # the current frame ends with a 4-byte content checksum
        self._tail = b""  # the start of a header the last read cut
        self._frame_start = 0

    def read(self, size: int = -1) -> bytes:
        """The next compressed bytes, their headers walked."""
        data = self._raw.read(size)
        if data and self._stage != _UNKNOWN:
            self._walk(data)
        self._offset += len(data)
        return data

    def _walk(self, data: bytes) -> None:
        """Follow the frame structure through the next bytes of the stream."""
        buf = self._tail + data if self._tail else data
        base = self._offset - len(self._tail)
        pos, end, stage, checksum, frame_start = self._skip, len(buf), self._stage, self._checksum, self._frame_start
        while pos < end:
            if stage == _BLOCK:
                if end - pos < 3:
                    break
                header = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                pos += 3 + (1 if header & 6 == 2 else header >> 3)  # an RLE block holds one byte
                if header & 1:  # the frame's last block
                    pos += 4 if checksum else 0
                    stage = _MAGIC
            else:
                frame_start = base + pos
                if end - pos < 5:  # a zstd frame's magic number and header descriptor
                    break
                magic = _U32.unpack_from(buf, pos)[0]
                if magic == _ZSTD_MAGIC:
                    descriptor = buf[pos + 4]
                    checksum = bool(descriptor & 4)
                    pos += 5 + _HEADER_REST[descriptor]
                    stage = _BLOCK
                elif magic & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:
                    if end - pos < 8:  # its magic number and payload size
                        break
                    pos += 8 + _U32.unpack_from(buf, pos + 4)[0]
                else:
                    stage = _UNKNOWN  # not a frame: the decoder fails on it
                    break
        self._skip, self._tail = (pos - end, b"") if pos >= end else (0, buf[pos:])
        self._stage, self._checksum, self._frame_start = stage, checksum, frame_start

    def check_complete(self) -> None:
        """Raise InputError unless the stream read so far ends on a frame boundary."""
        if self._stage == _UNKNOWN or (self._stage == _MAGIC and not self._skip and not self._tail):
            return
        raise InputError(f"{self._location}: truncated zstd stream: the file ends after {self._offset} bytes, "
                         f"inside the frame starting at byte {self._frame_start}")

    def close(self) -> None:
        """Close the underlying stream."""
        self._raw.close()


class _Decompressing(Protocol):
    """What _ZstdReader uses of zstandard's stream reader."""

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        """Decompress into `buffer`; 0 at the end of the data."""

    def tell(self) -> int:
        """Bytes decompressed so far."""

    def close(self) -> None:
        """Close the reader and its source."""


class _ZstdReader(io.RawIOBase):
    """Decompressed zstd data that fails at its end if the compressed stream was cut mid-frame."""

    def __init__(self, reader: _Decompressing, frames: _ZstdFrames) -> None:
        self._reader = reader
        self._frames = frames

    def readable(self) -> bool:
        """True: a stream to read."""
        return True

    def tell(self) -> int:
        """Bytes decompressed so far."""
        return self._reader.tell()

    def readinto(self, buffer: WriteableBuffer) -> int:
        """Decompress into `buffer`; at the end of the data, check the stream was complete."""
        count = self._reader.readinto(buffer)
        if count == 0 and memoryview(buffer).nbytes:
            self._frames.check_complete()
        return count

    def close(self) -> None:
        """Close the decompressor and the compressed stream."""
        if not self.closed:
            self._reader.close()
        super().close()


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
                      source.etag, source.version_id, source.mtime_ns)


def check_unchanged(source: SourceFile) -> None:
    """Fail when a local input changed since it was hashed (its bytes would not match the
    recorded SHA-256, and a cached result keyed on that hash would be wrong)."""
    if source.location.startswith("s3://"):
        return  # reads of S3 inputs are pinned to the version (or ETag) that was listed
    try:
        stat = os.stat(source.location)
    except OSError as exc:
        raise InputError(f"{source.location}: cannot read input file: {exc.strerror}") from None
    if stat.st_size != source.size or stat.st_mtime_ns != source.mtime_ns:
        raise InputError(f"{source.location}: changed during the build; rerun to pick up the new content")


def input_version(sources: list[SourceFile]) -> str:
    """One id over every input's relative path, size and hash."""
    from prep.manifest import canonical

    return "sha256:" + hashlib.sha256(canonical.dumps([s.to_json() for s in sources])).hexdigest()


def iter_lines_in_range(stream: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """Lines (without their newline) that START within [start, end) of a stream: a line belongs
    to the range holding its first byte, so adjacent ranges split a file without overlap or
    loss. Use end = sys.maxsize for a whole (e.g. decompressed) stream."""
    if start > 0:
        stream.seek(start - 1)
        if stream.read(1) != b"\n":
            stream.readline()  # finish the line owned by the previous range
    position = stream.tell()  # where the next line starts
    pending = b""
    while position < end:
        block = stream.read(LINE_BLOCK)
        if not block:
            if pending:
                yield pending  # a last line without a newline
            return
        lines = (pending + block).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if position >= end:
                return
            position += len(line) + 1
            yield line
