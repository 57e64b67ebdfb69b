"""Deletion requests: the files `[input] exclude` names, parsed into one packed, sorted table of
hashes a build drops documents by (docs/deletion.md).

A list file is UTF-8 text, one entry a line; blank lines and lines whose first non-blank
character is `#` are skipped, and surrounding whitespace is stripped. An entry is either
`id:<document id>` (the value of the input's id field, everything after the colon) or
`text:<32 hex digits>` (a text hash as `prep trace` reports it: the XXH3-128 digest of the
document's UTF-8 text, so every copy of that text is excluded). Nothing else is an entry, so an
id never passes for a hash. The table holds no id: each `id:` entry is kept as the first 16 bytes
of the SHA-256 of the id's UTF-8 bytes, each `text:` entry as its 16 digest bytes, both sorted
and without repeats, so a worker binary-searches it in place (prep.stages.exclude) and the
store never holds the ids a request named. This module loads no numpy: the driver reads it.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prep.errors import InputError
from prep.regular import open_regular

HASH_BYTES = 16
MAGIC = b"PREPEXC1"
_HEADER = struct.Struct("<8sQQ")
_HEX = frozenset("0123456789abcdef")
ID_PREFIX, TEXT_PREFIX = "id:", "text:"


def id_hash(doc_id: str) -> bytes:
    """The 16 bytes an excluded id is kept as: the head of the SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).digest()[:HASH_BYTES]


@dataclass(frozen=True)
class Entry:
    """One entry of a request: an id (`kind` "id") or a text hash in hex (`kind` "text")."""

    kind: str
    value: str

    def spelled(self) -> str:
        """The entry as a list file spells it."""
        return f"{self.kind}:{self.value}"


def parse_entry(line: str) -> Entry | None:
    """The entry a list line names, None for a blank or comment line; ValueError saying why for
    any other line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if text.startswith(ID_PREFIX):
        doc_id = text[len(ID_PREFIX):]
        if not doc_id:
            raise ValueError("an empty id (expected id:<document id>)")
        return Entry("id", doc_id)
    if text.startswith(TEXT_PREFIX):
        digest = text[len(TEXT_PREFIX):].lower()
        if len(digest) != 2 * HASH_BYTES or not _HEX.issuperset(digest):
            raise ValueError(f"{text[:60]!r}: a text hash is 32 hex digits (text:<XXH3-128 as prep trace prints it>)")
        return Entry("text", digest)
    raise ValueError(f"{text[:60]!r}: expected id:<document id> or text:<32 hex digits>")


@dataclass(frozen=True)
class ReadList:
    """A list file read: its entries with their line numbers, and the SHA-256 of its bytes."""

    entries: tuple[tuple[int, Entry], ...]
    sha256: str


def _read(path: Path, shown: str) -> bytes:
    """The list file's bytes; InputError `shown: why` when it cannot be read."""
    try:  # a FIFO or a device named as a list would block the read for ever
        with os.fdopen(open_regular(path), "rb") as stream:
            return stream.read()
    except OSError as exc:
        raise InputError(f"{shown}: cannot read the exclude list: {exc.strerror or exc}") from None


def _entries(data: bytes, shown: str) -> Iterator[tuple[int, Entry]]:
    """The entries of a list file's bytes with their line numbers, one at a time; InputError
    `shown:LINE: why` for a line that is no entry."""
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            entry = parse_entry(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError(f"{shown}:{number}: not UTF-8 text") from None
        except ValueError as exc:
            raise InputError(f"{shown}:{number}: {exc}") from None
        if entry is not None:
            yield number, entry


def read_entries(path: Path, shown: str) -> ReadList:
    """Every entry of the list file at `path` (named `shown` in errors), with its line number
    (for a request, which is small: a build's lists are hashed as they are read, load_exclusions)."""
    data = _read(path, shown)
    return ReadList(tuple(_entries(data, shown)), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class ListFile:
    """One exclude list as a snapshot records it: its path (as the pipeline names it), the SHA-256
    of its bytes, and how many entries it holds (never the entries)."""

    path: str
    sha256: str
    entries: int

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "sha256": self.sha256, "entries": self.entries}


@dataclass(frozen=True)
class Exclusions:
    """What a build's exclude lists name, packed: the table (sorted id hashes, then sorted text
    hashes) and the files it was made from. `sha256` (of the table) is what the tokenize task
    key and the manifest name."""

    table: bytes
    files: tuple[ListFile, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.table).hexdigest()

    def to_json(self) -> dict[str, object]:
        """The manifest's `exclude`: the table's SHA-256 and each list's path, SHA-256 and count."""
        return {"sha256": self.sha256, "files": [entry.to_json() for entry in self.files]}


def pack(entries: Iterable[Entry]) -> bytes:
    """The table of `entries`: header (magic, id count, text count), sorted id hashes, sorted
    text hashes, each distinct."""
    hashes: tuple[set[bytes], set[bytes]] = (set(), set())
    for entry in entries:
        _add(hashes, entry)
    return _packed(*hashes)


def _add(hashes: tuple[set[bytes], set[bytes]], entry: Entry) -> None:
    """Add an entry's 16 bytes to the id hashes or the text hashes."""
    if entry.kind == "id":
        hashes[0].add(id_hash(entry.value))
    else:
        hashes[1].add(bytes.fromhex(entry.value))


def _packed(ids: set[bytes], texts: set[bytes]) -> bytes:
    return b"".join([_HEADER.pack(MAGIC, len(ids), len(texts)), *sorted(ids), *sorted(texts)])


def unpack(table: bytes) -> tuple[memoryview, memoryview]:
    """The id hashes and the text hashes of a table `pack` made; ValueError for other bytes."""
    if len(table) < _HEADER.size:
        raise ValueError("too short for an exclusion table")
    magic, ids, texts = _HEADER.unpack_from(table)
    if magic != MAGIC or len(table) != _HEADER.size + HASH_BYTES * (ids + texts):
        raise ValueError("not an exclusion table")
    view = memoryview(table)[_HEADER.size:]
    return view[:HASH_BYTES * ids], view[HASH_BYTES * ids:]


def load_exclusions(paths: Sequence[str], base_dir: Path, has_ids: bool) -> Exclusions | None:
    """The exclusions of the lists at `paths` (relative to `base_dir`, the pipeline's folder); None
    without lists. Each entry is hashed as it is read (16 bytes kept, never its line), so a list of
    millions costs the driver a set of short bytes. InputError naming FILE:LINE for a bad line, and
    for an `id:` entry when the input has no id field (its documents have no id to match)."""
    if not paths:
        return None
    hashes: tuple[set[bytes], set[bytes]] = (set(), set())
    files = []
    for shown in paths:
        path = Path(shown).expanduser()
        data = _read(path if path.is_absolute() else base_dir / path, shown)
        count = 0
        for number, entry in _entries(data, shown):
            if entry.kind == "id" and not has_ids:
                raise InputError(f"{shown}:{number}: an id entry, but the pipeline names no input.id_field: "
                                 "exclude such documents by text:<hash>")
            _add(hashes, entry)
            count += 1
        files.append(ListFile(shown, hashlib.sha256(data).hexdigest(), count))
    return Exclusions(_packed(*hashes), tuple(files))
