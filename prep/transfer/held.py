"""DEST/.prep/share.json: which share of which snapshot a pulled folder holds.

`prep pull` writes it (atomically, after every file of the share is in place and before the
manifest) so that `prep verify DEST/.prep/manifest.json DEST` checks exactly the share the
folder was pulled as: rank, world size and formats come from the record, and flags that
disagree with it are refused instead of silently checking something else.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prep.errors import UsageError
from prep.formats.units import unit_names
from prep.transfer.shares import PREP_DIR, discard, read_own, temp_name
from prep.writeback import fsync_path

SHARE_SCHEMA = "prep.share/1"
SHARE_NAME = "share.json"


@dataclass(frozen=True)
class ShareSpec:
    """Which share: rank of world size (None, None: the whole snapshot) and formats (None: all)."""

    rank: int | None
    world_size: int | None
    formats: tuple[str, ...] | None

    def describe(self) -> str:
        """`rank 1 of 4, formats bin` / `the whole snapshot, all formats`, for messages."""
        where = f"rank {self.rank} of {self.world_size}" if self.rank is not None else "the whole snapshot"
        return f"{where}, formats {','.join(self.formats)}" if self.formats else f"{where}, all formats"


@dataclass(frozen=True)
class ShareRecord:
    """The content of DEST/.prep/share.json."""

    snapshot_id: str
    spec: ShareSpec

    def to_json(self) -> dict[str, Any]:
        return {"schema": SHARE_SCHEMA, "snapshot": self.snapshot_id, "rank": self.spec.rank,
                "world_size": self.spec.world_size,
                "formats": list(self.spec.formats) if self.spec.formats is not None else None}


def share_path(dest: Path) -> Path:
    """Where a folder's share record lives."""
    return dest / PREP_DIR / SHARE_NAME


def install_bytes(final: Path, raw: bytes) -> None:
    """Put `raw` at `final` atomically and durably (temporary, fsync, rename, fsync folder);
    a no-op rewrite when the same bytes are already there (in a regular file, not through a
    symlink: pull's own files stay in DEST)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if read_own(final, follow=False) == raw:
            fsync_path(final.parent)
            return
    temp = temp_name(final)
    try:
        with open(temp, "xb") as out:
            out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, final)
    finally:
        discard(temp)
    fsync_path(final.parent)


def write_share_record(dest: Path, record: ShareRecord) -> Path:
    """Record which share DEST holds (see the module docstring for when)."""
    final = share_path(dest)
    install_bytes(final, (json.dumps(record.to_json(), sort_keys=True) + "\n").encode())
    return final


def _parse(document: Any) -> ShareRecord | None:
    """The record in a parsed share.json, or None when it is not a valid prep.share/1."""
    if type(document) is not dict or document.get("schema") != SHARE_SCHEMA:
        return None
    snapshot, rank, world, formats = (document.get(k) for k in ("snapshot", "rank", "world_size", "formats"))
    if type(snapshot) is not str or set(document) != {"schema", "snapshot", "rank", "world_size", "formats"}:
        return None
    if (rank is None) != (world is None) or not all(v is None or type(v) is int for v in (rank, world)):
        return None
    if rank is not None and not 0 <= rank < world:
        return None
    if formats is not None and (type(formats) is not list or not formats
                                or any(f not in unit_names() for f in formats) or formats != sorted(set(formats))):
        return None
    return ShareRecord(snapshot, ShareSpec(rank, world, tuple(formats) if formats is not None else None))


def read_share_record(dest: Path) -> ShareRecord | None:
    """DEST's share record, None when there is none; a damaged one is a UsageError naming it."""
    path = share_path(dest)
    try:
        raw = read_own(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        record = _parse(json.loads(raw))
    except ValueError:
        record = None
    if record is None:
        raise UsageError(f"{path}: not a valid {SHARE_SCHEMA} share record; pull again or pass --rank/--world-size")
    return record


def _flag_text(flags: ShareSpec) -> str:
    """The share flags as typed: `--rank 1 --world-size 2 --formats bin`."""
    ranked = f"--rank {flags.rank} --world-size {flags.world_size}" if flags.rank is not None else ""
    return " ".join(part for part in (ranked, f"--formats {','.join(flags.formats)}" if flags.formats else "") if part)


def choose_share(record: ShareRecord | None, snapshot_id: str, flags: ShareSpec, dest: Path) -> tuple[ShareSpec, bool]:
    """The share to verify and whether the record chose (part of) it. With no record about this
    snapshot: the flags'. A record of a rank's share: that share; a flag that differs conflicts.
    A record of whole shards (no rank): the flags may pick any rank and a subset of its formats."""
    if record is None or record.snapshot_id != snapshot_id:
        return flags, False
    held = record.spec
    if flags.rank is None and flags.formats is None:
        return held, True
    if held.rank is None:
        wanted = flags.formats if flags.formats is not None else held.formats
        if held.formats is None or (wanted is not None and set(wanted) <= set(held.formats)):
            return ShareSpec(flags.rank, flags.world_size, wanted), flags.formats is None and wanted is not None
    elif ((flags.rank is None or (flags.rank, flags.world_size) == (held.rank, held.world_size))
          and (flags.formats is None or flags.formats == held.formats)):
        return held, True
    raise UsageError(f"{_flag_text(flags)} conflicts with {share_path(dest)}: this folder holds "
                     f"{held.describe()} of {snapshot_id}; drop the flags to verify what it holds")
