"""This process's memory: how much is resident, and giving free pages back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Callable


def resident_bytes() -> int | None:
    """This process's resident memory (Linux), None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def trim_heap() -> None:
    """Give the C heap's free pages back to the system, between two batches of a task. glibc
    serves blocks under its mmap threshold (which rises to 32 MiB once a large block is freed)
    from the heap, where a batch's freed buffers leave holes the next batch's do not fit: without
    this, a tokenize task's peak grew with the number of tasks its worker had run (16M short
    documents: from 370 MB to 430 MB over 30 tasks, the resting size flat at 240 MB)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_free_memory() -> None:
    """Give free pages back to the system after a task (Arrow's memory pool, then the C heap), so a
    worker that ran a large task holds no more than the next one needs: without it, pages freed
    by one kind of task stayed resident beside the next kind's, and a worker's peak grew with the
    number of tasks it ran."""
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    trim_heap()
