"""Each process's private scratch folder for an S3 store (`prep-s3-staging-<host>-<pid>-<random>`
in TMPDIR): made on first use, removed when the process exits, and, for a process that never
ran its exit hooks (a pool or Ray worker ends with `os._exit` or a signal), removed by the next
process on the same host that makes one, once its process is gone.

Nothing in it outlives its task: a worker stages a file there and uploads it before its task
ends, so a dead process's folder holds nothing anyone will read.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

PREFIX = "prep-s3-staging-"
_OWN: dict[int, Path] = {}  # pid -> its folder (a forked child starts with its parent's entries)


def process_folder() -> Path:
    """This process's scratch folder (made, and stale ones of this host swept, on first use)."""
    pid = os.getpid()
    if pid not in _OWN:
        root = Path(tempfile.gettempdir())
        sweep(root)
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{_host()}-{pid}-", dir=root))
        _OWN[pid] = folder
        # atexit runs in a process that exits normally; multiprocessing's workers skip it and run
        # their Finalize hooks instead.
        multiprocessing.util.Finalize(None, _remove, args=(pid, folder), exitpriority=0)
    return _OWN[pid]


def sweep(root: Path) -> int:
    """Remove the scratch folders under `root` of this host's processes that are gone; how many."""
    pattern = re.compile(rf"{re.escape(PREFIX)}{re.escape(_host())}-(\d+)-[a-z0-9_]+")
    removed = 0
    for entry in _entries(root):
        found = pattern.fullmatch(entry.name)
        if found and int(found[1]) != os.getpid() and not _alive(int(found[1])) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _entries(root: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(root) as entries:
            return [entry for entry in entries if entry.name.startswith(PREFIX)]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _host() -> str:
    """This host's name as a folder name holds it (no separators)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _remove(pid: int, folder: Path) -> None:
    """Remove `folder` if this is the process that made it (a forked child must not remove its parent's)."""
    if os.getpid() == pid:
        shutil.rmtree(folder, ignore_errors=True)
        _OWN.pop(pid, None)


@atexit.register
def _remove_own() -> None:
    """At a normal exit: this process's folder, and those of this host's processes that are gone
    (a driver outlives the pool workers it ended with a signal)."""
    for pid, folder in list(_OWN.items()):
        _remove(pid, folder)
    sweep(Path(tempfile.gettempdir()))
