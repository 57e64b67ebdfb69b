"""`prep pull --prune`: delete what DEST's previous snapshot named and the new one does not.

The old paths come from DEST/.prep/manifest.json, read under the pull lock before anything
changes; nothing else is ever deleted (docs/pull-verify.md, "A new version into the same folder").
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from prep.errors import PrepError
from prep.faults import crash_point
from prep.store.snapshots import Snapshot, read_manifest_content
from prep.transfer.paths import Resolver
from prep.transfer.shares import PREP_DIR, artifacts_of, check_paths, read_own
from prep.writeback import fsync_path

MANIFEST_NAME = "manifest.json"


def ancestors(path: str) -> Iterator[str]:
    """The folders above a relative path, deepest first, ending with "" (DEST itself)."""
    while path:
        path = path.rpartition("/")[0]
        yield path


def previous_paths(dest: Path, snapshot: Snapshot, named: set[str]) -> tuple[set[str] | None, str | None]:
    """The artifact paths DEST's manifest (an earlier pull's) names, read before it is
    replaced; or None and why it cannot be trusted (missing, not a valid manifest, unsafe)."""
    path = dest / PREP_DIR / MANIFEST_NAME
    try:
        if read_own(path) == snapshot.raw:  # a FIFO there never blocks the pull
            return named, None
    except FileNotFoundError:
        return None, f"{path} does not exist (no earlier pull completed in this folder)"
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror or exc})"
    try:
        artifacts = artifacts_of(read_manifest_content(path))
        for artifact in artifacts:
            artifact.path.encode()  # a lone surrogate: pull never wrote that (UnicodeError)
        check_paths((artifact.path for artifact in artifacts), dest, str(path))
    except PrepError as exc:
        return None, exc.message
    except UnicodeError as exc:
        return None, f"{path}: not a canonical prep manifest ({exc})"
    return {artifact.path for artifact in artifacts}, None


def prune(dest: Path, stale: Iterable[str], keep: set[str]) -> tuple[int, int]:
    """Delete the files at `stale` paths (never a folder, nor the file of a path in `keep` that a
    symlinked folder makes them alias), then the folders that leaves empty unless `keep` has
    paths below them, and fsync the folders that changed: (files, bytes)."""
    files = size = 0
    touched: set[str] = set()
    stale = sorted(stale)
    entry = Resolver(os.path.realpath(dest)).entry
    needed = {entry(path) for path in keep} if stale else set()
    for path in stale:
        target = os.path.join(dest, path)
        try:
            info = os.lstat(target)
            if stat.S_ISDIR(info.st_mode) or entry(path) in needed:
                continue  # a folder where the old snapshot had a file, or a file the new one needs
            os.unlink(target)
        except (FileNotFoundError, NotADirectoryError):
            continue
        files, size = files + 1, size + info.st_size
        touched.update(ancestors(path))
        crash_point("pull.after_prune")
    if touched:
        _remove_emptied(dest, touched, keep)
    return files, size


def _remove_emptied(dest: Path, touched: set[str], keep: set[str]) -> None:
    """rmdir the touched folders no kept path lives under (only when empty), deepest first, then
    fsync those that remain."""
    containers = {folder for path in keep for folder in ancestors(path)}
    for folder in sorted(touched - containers - {""}, key=lambda f: -f.count("/")):
        with contextlib.suppress(OSError):  # not empty: someone else's files stay
            os.rmdir(os.path.join(dest, folder))
    for folder in touched:
        if os.path.isdir(os.path.join(dest, folder)):
            fsync_path(dest / folder)
