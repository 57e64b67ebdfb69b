"""Durability helpers: fsync by path, and early writeback (start writing a file's dirty pages now).

A file that is only fsynced when complete leaves the whole of it to that final fsync (the kernel
otherwise waits up to 30 s, or for gigabytes of dirty pages, before writing anything). Starting
writeback of each region as soon as it is written lets the disk work while the CPU produces the
rest, so the fsync that makes the file durable finds little left to do. The fsync is still what
makes a file durable: this only moves disk work earlier. Linux only (`sync_file_range`);
elsewhere a no-op.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path

SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range; do not wait for it


def _load() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _load()


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start (not wait for) writing `nbytes` at `offset` of the open file `fd` to disk.

    Failures are ignored: this is only a hint, and the caller's fsync reports real errors."""
    if _SYNC_FILE_RANGE is not None and nbytes > 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE)


def available() -> bool:
    """True where early writeback is supported (Linux)."""
    return _SYNC_FILE_RANGE is not None


def fsync_path(path: Path) -> None:
    """fsync a file or folder by path (a folder's fsync makes its new entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
