"""The ledger: exactly which documents the first N global samples of a Reader touched, and one
digest over what they read, so two runs can prove they trained on the same data.

Sample i of a source is tokens [i * L, i * L + L + 1) of its stream (tokens mode) or document i
(documents mode); np.searchsorted on the source's document bounds maps a chunk of windows to the
documents they overlap at once. Memory is the bounds arrays plus one entry per touched document,
never the whole snapshot.

Documents are named from the WebDataset `.json` members (shard by shard, in key order, as the
`.bin` files hold them) when the `.tar` files are at hand, else by position
(`bin/<shard>.bin:<sequence>`); a document query also asks whether a snapshot holds the id at all.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np

from prep.data.checks import sample_count
from prep.data.reader import Exhausted, Reader
from prep.data.source import SnapshotSource
from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.formats import wds
from prep.formats.units import BIN, WDS
from prep.hashing import digest_file
from prep.store import cas

REPORT_SCHEMA = "prep.consumed-report/1"
DIGEST_DOMAIN = b"prep.consumed-digest/1\n"
CHUNK = 1 << 16  # global samples mapped to documents at once
_SHIFT = 40  # a touched document's key: source << _SHIFT | position in the source's stream
_PAIR = np.dtype([("sha", "S32"), ("lo", "<i8"), ("hi", "<i8")])  # what the digest hashes per pair
Name = tuple[str, str, str | None, int | None]  # shard path, id, input file, line


@dataclass(frozen=True)
class DocumentUse:
    """One touched document: its name, where it sits, and what the samples read of it."""

    id: str
    source: str | None  # the input file it was read from (None when named by position)
    line: int | None
    snapshot: str
    shard: str  # the .bin artifact holding it
    sequence: int  # its index in that shard
    position: int  # its index in the source's token stream
    length: int  # its tokens, EOS included
    tokens: int  # tokens the samples read from it (a shared boundary token counts in both windows)
    windows: int  # samples whose window touched it
    first_sample: int  # the first global sample that touched it
    sha256: str | None  # of its tokens as little-endian uint32 (None in a document query)
    samples: tuple[int, ...] | None = None  # every global sample touching it (document queries only)

    def to_json(self) -> dict[str, Any]:
        """The document as the report prints it."""
        body = {key: value for key, value in self.__dict__.items() if value is not None or key in ("source", "line")}
        return {**body, "samples": list(self.samples)} if self.samples is not None else body


@dataclass(frozen=True)
class SourceUse:
    """One mixture source: samples and tokens it served, documents touched, epochs, naming."""

    snapshot: str
    samples: int
    tokens: int
    documents: int
    epochs: float  # samples served / samples per epoch
    epochs_reached: int  # highest epoch reached + 1 (0 when it served nothing)
    names: str  # "wds" or "position"

    def to_json(self) -> dict[str, Any]:
        """The source as the report prints it."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Settings:
    """What fixes the samples: the reader's settings and the resolved mixture."""

    samples: int
    seq_len: int
    global_batch_size: int
    seed: int
    mode: str
    mixture: str
    sources: tuple[SourceUse, ...]

    @property
    def tokens(self) -> int:
        """Tokens served: samples * (seq_len + 1) in tokens mode."""
        return sum(source.tokens for source in self.sources)

    @property
    def names(self) -> str:
        """How documents are named: "wds", "position", or "mixed" across sources."""
        methods = {source.names for source in self.sources}
        return methods.pop() if len(methods) == 1 else "mixed"

    def header(self, kind: str) -> dict[str, Any]:
        """The fields every report kind starts with."""
        return {"schema": REPORT_SCHEMA, "kind": kind, "samples": self.samples, "seq_len": self.seq_len,
                "global_batch_size": self.global_batch_size, "seed": self.seed, "mode": self.mode,
                "mixture": self.mixture, "names": self.names, "tokens": self.tokens,
                "sources": [source.to_json() for source in self.sources]}


@dataclass(frozen=True)
class Ledger(_Settings):
    """The touched documents in order of first touch, and the digest over the pairs in sample order."""

    documents: tuple[DocumentUse, ...]
    digest: str

    def to_json(self) -> dict[str, Any]:
        """The prep.consumed-report/1 ledger."""
        return {**self.header("ledger"), "digest": self.digest,
                "documents": [document.to_json() for document in self.documents]}


@dataclass(frozen=True)
class DocumentQuery(_Settings):
    """Whether (how often, at which global samples) one document id was touched."""

    document: str
    matches: tuple[DocumentUse, ...]

    @property
    def touched(self) -> bool:
        """True when any document of that id was touched."""
        return bool(self.matches)

    def to_json(self) -> dict[str, Any]:
        """The prep.consumed-report/1 document answer."""
        return {**self.header("document"), "document": self.document, "touched": self.touched,
                "windows": sum(m.windows for m in self.matches), "matches": [m.to_json() for m in self.matches]}


@dataclass(frozen=True)
class _Pairs:
    """The (window, document) pairs of a chunk of global samples, in sample order."""

    sample: np.ndarray
    source: np.ndarray
    document: np.ndarray
    lo: np.ndarray  # token range read, relative to the document's start
    hi: np.ndarray

    @property
    def keys(self) -> np.ndarray:
        """Each pair's document key (source << _SHIFT | position)."""
        keys: np.ndarray = (self.source << _SHIFT) | self.document
        return keys


def _spans(reader: Reader, bounds: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, ...]:
    """(row, document, lo, hi) of every document the windows of samples `index` of one source overlap."""
    if reader.mode == "documents":
        return np.arange(len(index)), index, np.zeros(len(index), dtype=np.int64), bounds[index + 1] - bounds[index]
    start = index * reader.seq_len
    end = start + reader.seq_len + 1
    first = np.searchsorted(bounds, start, side="right") - 1
    count = np.searchsorted(bounds, end - 1, side="right") - first
    rows = np.repeat(np.arange(len(index)), count)
    document = first[rows] + np.arange(len(rows)) - np.repeat(np.cumsum(count) - count, count)
    lo = np.maximum(start[rows], bounds[document]) - bounds[document]
    return rows, document, lo, np.minimum(end[rows], bounds[document + 1]) - bounds[document]


def _chunks(reader: Reader, bounds: list[np.ndarray], samples: int) -> Iterator[tuple[np.ndarray, _Pairs]]:
    """Per chunk of global samples: (source, epoch, sample) of each, and the pairs they read."""
    for first in range(0, samples, CHUNK):
        count = min(CHUNK, samples - first)
        try:
            picked = np.asarray(reader.sample_ids(first, count), dtype=np.int64).reshape(count, 3)
        except Exhausted as exc:
            raise UsageError(f"the first {samples} samples go past the end of the mixture: {exc}") from None
        parts = []
        for source in np.unique(picked[:, 0]).tolist():
            where = np.flatnonzero(picked[:, 0] == source)
            rows, document, lo, hi = _spans(reader, bounds[source], picked[where, 2])
            parts.append((first + where[rows], np.full(len(rows), source, dtype=np.int64), document, lo, hi))
        columns = [np.concatenate(column) for column in zip(*parts)]
        order = np.argsort(columns[0], kind="stable")  # each source's pairs are in sample order already
        yield picked, _Pairs(*(column[order].astype(np.int64) for column in columns))


class _Tally:
    """Counts per touched document and per source, and the running digest over the pairs."""

    def __init__(self, reader: Reader, bounds: list[np.ndarray], hashing: bool) -> None:
        self.reader, self.bounds, self.hashing = reader, bounds, hashing
        self.handles: dict[int, int] = {}
        self.keys: list[int] = []
        self.tokens = np.zeros(1024, dtype=np.int64)
        self.windows = np.zeros(1024, dtype=np.int64)
        self.first = np.zeros(1024, dtype=np.int64)
        self.shas = np.zeros(1024, dtype="S32")
        count = len(reader.sources)
        self.source_samples = np.zeros(count, dtype=np.int64)
        self.source_tokens = np.zeros(count, dtype=np.int64)
        self.top_epoch = np.full(count, -1, dtype=np.int64)
        self.digest = hashlib.sha256(DIGEST_DOMAIN)

    def add(self, picked: np.ndarray, pairs: _Pairs) -> None:
        """Count one chunk."""
        np.add.at(self.source_samples, picked[:, 0], 1)
        np.maximum.at(self.top_epoch, picked[:, 0], picked[:, 1])
        np.add.at(self.source_tokens, pairs.source, pairs.hi - pairs.lo)
        unique, first_at, inverse = np.unique(pairs.keys, return_index=True, return_inverse=True)
        firsts = pairs.sample[first_at].tolist()
        handles = np.array([self.handles[key] if key in self.handles else self._new(key, first)
                            for key, first in zip(unique.tolist(), firsts)], dtype=np.int64)
        inverse = inverse.reshape(-1)
        self.tokens[handles] += np.bincount(inverse, weights=pairs.hi - pairs.lo, minlength=len(unique)).astype(np.int64)
        self.windows[handles] += np.bincount(inverse, minlength=len(unique))
        if self.hashing:
            records = np.empty(len(inverse), dtype=_PAIR)
            records["sha"], records["lo"], records["hi"] = self.shas[handles[inverse]], pairs.lo, pairs.hi
            self.digest.update(records.tobytes())

    def _new(self, key: int, first_sample: int) -> int:
        """A handle for a document touched for the first time."""
        handle = len(self.keys)
        if handle == len(self.tokens):
            self.tokens, self.windows, self.first, self.shas = (np.concatenate([a, np.zeros_like(a)]) for a in
                                                                 (self.tokens, self.windows, self.first, self.shas))
        self.keys.append(key)
        self.handles[key] = handle
        self.first[handle] = first_sample
        if self.hashing:
            source, position = key >> _SHIFT, key & ((1 << _SHIFT) - 1)
            bounds = self.bounds[source]
            tokens = self.reader.sources[source].tokens(int(bounds[position]), int(bounds[position + 1] - bounds[position]))
            self.shas[handle] = hashlib.sha256(np.asarray(tokens, dtype="<u4").tobytes()).digest()
        return handle


def _scan(reader: Reader, samples: int, hashing: bool) -> tuple[_Tally, list[np.ndarray]]:
    """Map the first `samples` global samples to documents and count them."""
    bounds = [source.document_bounds() for source in reader.sources]
    tally = _Tally(reader, bounds, hashing)
    for picked, pairs in _chunks(reader, bounds, samples):
        tally.add(picked, pairs)
    return tally, bounds


def positional(name: str) -> bool:
    """True for a name by position: `bin/<shard>.bin:<sequence>`."""
    path, _, number = name.rpartition(":")
    return path.endswith("." + BIN) and number.isdigit()


def _root(path: Path, key: str) -> Path | None:
    """`path` without its trailing `key` (a manifest path or an object key), if it ends so."""
    parts = PurePosixPath(key).parts
    return Path(*path.parts[:-len(parts)]) if path.parts[-len(parts):] == parts else None


def _tar_files(source: SnapshotSource) -> dict[int, tuple[Path, str]] | None:
    """Each shard's WebDataset .tar (path, sha256), found beside its .bin, or None when absent."""
    artifacts = source.snapshot.manifest["artifacts"]
    tars = {int(a["shard"]): a for a in artifacts if a["format"] == WDS}
    bins = {int(a["shard"]): a for a in artifacts if a["format"] == BIN}
    if not bins or set(tars) != set(bins):
        return None
    first = source.shards[0]
    namings: tuple[Callable[[dict[str, Any]], str], ...] = (lambda a: str(a["path"]),
                                                            lambda a: cas.object_key(str(a["sha256"])))
    for key_of in namings:  # a pulled folder keeps manifest paths, a local store object keys
        root = _root(first.bin_path, key_of(bins[first.index]))
        if root is not None:
            found = {shard: (root / key_of(a), str(a["sha256"])) for shard, a in tars.items()}
            if all(path.is_file() for path, _ in found.values()):
                return found
    return None


def _read_json(handle: BinaryIO, size: int) -> Any:
    return json.loads(handle.read(size))


def _json_members(path: Path, sha256: str) -> Iterator[tuple[int, Callable[[], Any]]]:
    """(sequence, a reader of its body) of each `.json` member of a checked .tar, in order, reading
    headers only (a body is read when its reader is called, before the next member is asked for)."""
    if digest_file(path).sha256 != sha256:
        raise IntegrityError(f"{path}: does not match the snapshot (sha256 differs); refusing to name documents from it")
    offset, sequence = 0, -1
    with open(path, "rb") as handle:
        while True:
            handle.seek(offset)
            block = handle.read(wds.BLOCK_SIZE)
            if len(block) < wds.BLOCK_SIZE or not block.strip(b"\0"):
                return
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.TarError as exc:
                raise IntegrityError(f"{path}: not a readable tar archive: {exc}") from None
            offset += wds.BLOCK_SIZE + wds.padded_size(info.size)
            if info.name.endswith("." + wds.JSON_SUFFIX):
                sequence += 1
                yield sequence, partial(_read_json, handle, info.size)


def _tar_names(path: Path, sha256: str, wanted: set[int]) -> dict[int, dict[str, Any]]:
    """The `.json` members of samples `wanted` (by sequence) of a checked .tar, reading headers only."""
    found: dict[int, dict[str, Any]] = {}
    last = max(wanted)
    for sequence, body in _json_members(path, sha256):
        if sequence in wanted:
            found[sequence] = body()
        if sequence >= last:
            break
    if len(found) != len(wanted):
        raise IntegrityError(f"{path}: holds fewer documents than the snapshot says")
    return found


def names_of(source: SnapshotSource, bounds: np.ndarray, positions: list[int]) -> tuple[str, dict[int, tuple[int, Name]]]:
    """How `source`'s documents are named, and (sequence in its shard, name) of each position."""
    starts = np.concatenate(([0], np.cumsum([shard.documents for shard in source.shards], dtype=np.int64)))
    if int(starts[-1]) != len(bounds) - 1:
        raise IntegrityError(f"{source.id}: the .idx files hold {len(bounds) - 1} documents, the manifest {starts[-1]}")
    bins = {int(a["shard"]): str(a["path"]) for a in source.snapshot.manifest["artifacts"] if a["format"] == BIN}
    where = np.searchsorted(starts, np.asarray(positions, dtype=np.int64), side="right") - 1
    placed = {p: (int(s), p - int(starts[s])) for p, s in zip(positions, where.tolist())}
    paths = {s: bins[source.shards[s].index] for s, _ in placed.values()}
    tars = _tar_files(source)
    if tars is None:
        return "position", {p: (q, (paths[s], f"{paths[s]}:{q}", None, None)) for p, (s, q) in placed.items()}
    by_shard: dict[int, set[int]] = {}
    for s, q in placed.values():
        by_shard.setdefault(s, set()).add(q)
    members = {s: _tar_names(*tars[source.shards[s].index], wanted) for s, wanted in by_shard.items()}
    named: dict[int, tuple[int, Name]] = {}
    for p, (s, q) in placed.items():
        member, length = members[s][q], int(bounds[p + 1] - bounds[p])
        if member.get("tokens") != length or not isinstance(member.get("id"), str):
            raise IntegrityError(f"{tars[source.shards[s].index][0]}: sample {q} says {member.get('tokens')!r} tokens, "
                                 f"the .idx {length}; the formats disagree")
        named[p] = (q, (paths[s], member["id"], member.get("source"), member.get("line")))
    return "wds", named


def holds(source: SnapshotSource, method: str, document: str) -> bool:
    """Whether `source` has a document of id `document`: named by position, its shard and sequence are
    in the manifest; by WebDataset members, one of them has that id (every member's `.json` is read)."""
    if method == "position":
        path, _, number = document.rpartition(":")
        return positional(document) and any(a["format"] == BIN and a["path"] == path and int(number) < int(a["documents"])
                                            for a in source.snapshot.manifest["artifacts"])
    tars = _tar_files(source) or {}
    return any(isinstance(member := body(), dict) and member.get("id") == document
               for path, sha256 in tars.values() for _, body in _json_members(path, sha256))


def _uses(reader: Reader, tally: _Tally, bounds: list[np.ndarray]) -> tuple[list[str], dict[int, DocumentUse]]:
    """Each source's naming method, and every touched document by key, in order of first touch."""
    methods, uses = [], {}
    keys = np.asarray(tally.keys, dtype=np.int64)
    for index, source in enumerate(reader.sources):
        mine = np.flatnonzero((keys >> _SHIFT) == index)
        positions = (keys[mine] & ((1 << _SHIFT) - 1)).tolist()
        method, names = names_of(source, bounds[index], positions)
        methods.append(method)
        for handle, position in zip(mine.tolist(), positions):
            sequence, (shard, name, file, line) = names[position]
            sha = tally.shas[handle].hex() if tally.hashing else None
            uses[tally.keys[handle]] = DocumentUse(
                name, file, line, source.id, shard, sequence, position,
                int(bounds[index][position + 1] - bounds[index][position]), int(tally.tokens[handle]),
                int(tally.windows[handle]), int(tally.first[handle]), sha)
    ordered = sorted(uses.items(), key=lambda item: (item[1].first_sample, item[0]))
    return methods, dict(ordered)


def _settings(reader: Reader, samples: int, tally: _Tally, methods: list[str]) -> dict[str, Any]:
    """The _Settings fields of a report over `reader`."""
    touched = np.bincount(np.asarray(tally.keys, dtype=np.int64) >> _SHIFT, minlength=len(reader.sources))
    sources = tuple(SourceUse(source.id, int(tally.source_samples[i]), int(tally.source_tokens[i]), int(touched[i]),
                              float(tally.source_samples[i]) / reader.sizes[i], int(tally.top_epoch[i]) + 1, methods[i])
                    for i, source in enumerate(reader.sources))
    return {"samples": samples, "seq_len": reader.seq_len, "global_batch_size": reader.global_batch_size,
            "seed": reader.seed, "mode": reader.mode, "mixture": reader.mixture_id, "sources": sources}


def consumed(reader: Reader, samples: int) -> Ledger:
    """The ledger of the first `samples` global samples `reader` serves (from sample 0)."""
    samples = sample_count(samples)  # a bool, 1.5 or a numpy integer would reach the report
    tally, bounds = _scan(reader, samples, hashing=True)
    methods, uses = _uses(reader, tally, bounds)
    return Ledger(**_settings(reader, samples, tally, methods), documents=tuple(uses.values()),
                  digest="sha256:" + tally.digest.hexdigest())


def find(reader: Reader, samples: int, document: str) -> DocumentQuery:
    """Whether document id `document` was touched in the first `samples` global samples, by which."""
    samples = sample_count(samples)  # a bool, 1.5 or a numpy integer would reach the report
    tally, bounds = _scan(reader, samples, hashing=False)
    methods, uses = _uses(reader, tally, bounds)
    matches = {key: use for key, use in uses.items() if use.id == document}
    hits: dict[int, list[int]] = {key: [] for key in matches}
    if matches:
        wanted = np.asarray(sorted(matches), dtype=np.int64)
        for _, pairs in _chunks(reader, bounds, samples):
            keys = pairs.keys
            chosen = np.isin(keys, wanted)
            for key, sample in zip(keys[chosen].tolist(), pairs.sample[chosen].tolist()):
                hits[key].append(sample)
    if not matches and "position" in methods and not positional(document):
        unnamed = reader.sources[methods.index("position")].id
        raise UsageError(f"{document}: cannot rule it out: {unnamed} has no WebDataset .tar at hand, so its documents are "
                         "named by position; ask for SHARD_PATH:SEQUENCE (prep trace gives it) or pull the wds format")
    if not matches and not any(holds(source, method, document) for source, method in zip(reader.sources, methods)):
        held = ", ".join(source.id[:19] for source in reader.sources)  # a typo must not read as "not touched"
        raise NotFoundError(f"{document}: {held} holds no document of this id; check the id")
    found = tuple(replace(use, samples=tuple(hits[key])) for key, use in matches.items())
    return DocumentQuery(**_settings(reader, samples, tally, methods), document=document, matches=found)
