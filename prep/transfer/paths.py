"""Refusing unsafe manifests: artifact paths that would land outside DEST, in DEST's own
`.prep/` folder, under a temporary's name, or onto another artifact's file (docs/pull-verify.md,
"Manifests refused")."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from prep.errors import InputError

PREP_DIR = ".prep"
TOKENIZER_NAME = "tokenizer.json"  # DEST/.prep/tokenizer.json: the snapshot's tokenizer file
TEMP_MARKER = ".prep-tmp-"


def _unsafe_reason(path: str) -> str | None:
    """Why a path is unsafe by its spelling alone, or None."""
    parts = path.split("/")
    if path.startswith("/"):
        return "is absolute"
    if "\0" in path:
        return "contains a NUL byte"
    if ".." in parts:
        return "contains '..'"
    if "" in parts or "." in parts:
        return "is not a normalized relative path"
    if parts[0] == PREP_DIR:
        return f"is inside the reserved {PREP_DIR}/ folder"
    if TEMP_MARKER in parts[-1]:
        return f"uses the reserved temporary marker {TEMP_MARKER!r}"
    return None


def _symlinks_in(folder: str) -> frozenset[str]:
    """The names of the symlinks in a folder."""
    try:
        with os.scandir(folder) as entries:
            return frozenset(entry.name for entry in entries if entry.is_symlink())
    except OSError:  # absent, not a folder, unreadable: nothing in it can redirect a path
        return frozenset()


class Resolver:
    """Where paths relative to `root` land, following the symlinks there now, with one
    `realpath` and one listing per folder, not per file."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.folders: dict[str, tuple[str, frozenset[str]]] = {}

    def _folder(self, folder: str) -> tuple[str, frozenset[str]]:
        """A folder's real path and the symlinks in it."""
        known = self.folders.get(folder)
        if known is None:
            real = os.path.realpath(os.path.join(self.root, folder)) if folder else self.root
            known = self.folders[folder] = (real, _symlinks_in(real))
        return known

    def entry(self, path: str) -> str:
        """Where the path's directory entry is (what `unlink` or a rename onto it changes): its
        folders resolved, its own name not."""
        folder, _, name = path.rpartition("/")
        real = self._folder(folder)[0]
        return f"{real}/{name}" if real != "/" else f"/{name}"

    def __call__(self, path: str) -> str:
        """`realpath(root/path)`: a file's own name needs resolving only when it is a symlink."""
        folder, _, name = path.rpartition("/")
        if name in self._folder(folder)[1]:
            return os.path.realpath(os.path.join(self.root, path))
        return self.entry(path)


def check_paths(paths: Iterable[str], dest: Path, source: str) -> None:
    """Refuse (InputError, exit 2) a manifest whose artifact paths are absolute, climb with '..' or
    repeat, and a DEST whose symlinks make a path resolve outside it or share one file with another."""
    root = os.path.realpath(dest)
    inside = root.rstrip("/") + "/"
    resolve = Resolver(root)
    seen: set[str] = set()
    entries: dict[str, str] = {}  # where each path's directory entry is -> the path
    for path in paths:
        reason = _unsafe_reason(path)
        if reason is None and path in seen:
            reason = "is listed twice"
        if reason is not None:
            raise InputError(f"{source}: artifact path {path!r} {reason}; manifest refused")
        real, entry = resolve(path), resolve.entry(path)
        if real != root and not real.startswith(inside):
            _refuse_dest(dest, path, f"resolves outside {dest} through a symlink (to {real})")
        if entry in entries:
            _refuse_dest(dest, path, f"lands on the same file as {entries[entry]!r} through a symlinked folder (at {entry})")
        seen.add(path)
        entries[entry] = path


def _refuse_dest(dest: Path, path: str, reason: str) -> None:
    """A symlink in DEST, not the manifest, is what stands in the way: say so, and what to do."""
    raise InputError(f"{dest}: artifact path {path!r} {reason}; nothing was read or written there: remove the symlink, "
                     "or use another DEST")
