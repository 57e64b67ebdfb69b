"""A process's resident memory, as the tokenize stage reads it to bound its tokenizer's caches."""

from __future__ import annotations

import resource

from prep import memory


def test_resident_bytes_reads_this_process() -> None:
    resident = memory.resident_bytes()
    assert resident is not None
    assert 10 << 20 < resident < 2 * resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = bytearray(64 << 20)  # touched pages are resident
    grown = memory.resident_bytes()
    assert grown is not None and grown - resident > 48 << 20
    del held
