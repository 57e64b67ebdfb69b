"""A process's resident memory, as the tokenize stage reads it to bound its tokenizer's caches."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from prep import memory


def test_resident_bytes_reads_this_process() -> None:
    resident = memory.resident_bytes()
    assert resident is not None
    assert 10 << 20 < resident < 2 * resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = bytearray(64 << 20)  # touched pages are resident
    grown = memory.resident_bytes()
    assert grown is not None and grown - resident > 48 << 20
    del held


_HOLES = """
from prep import memory
large = b"\\0" * (30 << 20)
del large  # a freed mmapped block raises glibc's threshold: 1 MiB blocks now come from the heap
blocks = [b"x" * (1 << 20) for _ in range(96)]
del blocks[::2]  # every other one freed: holes between live blocks, none at the heap's top
held = memory.resident_bytes()
memory.trim_heap()
print(held - memory.resident_bytes())
"""


def test_trim_heap_gives_back_the_holes_freed_blocks_leave_in_the_heap() -> None:
    """Blocks under glibc's mmap threshold live in the heap; freed between live ones, they
    stay resident until the heap is trimmed (in a fresh interpreter: this one's heap is not known)."""
    if memory._malloc_trim() is None:
        pytest.skip("the C library has no malloc_trim")
    released = int(subprocess.run([sys.executable, "-c", _HOLES], check=True, capture_output=True,
                                  text=True).stdout)
    assert released > 40 << 20  # of the 48 MiB freed
