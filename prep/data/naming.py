"""How the ledger names a snapshot's documents: from the WebDataset `.json` members (shard by shard,
in key order, as the `.bin` files hold them) when the `.tar` files are at hand, else by position
(`bin/<shard>.bin:<sequence>`); and whether a snapshot holds a document id at all."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import numpy as np

from prep.data.source import SnapshotSource
from prep.errors import IntegrityError
from prep.formats import wds
from prep.formats.units import BIN, WDS
from prep.hashing import digest_file
from prep.store import cas

Name = tuple[str, str, str | None, int | None]  # shard path, id, input file, line


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
