"""Early writeback is only a hint: it never changes a file's bytes, and HashingWriter's digest is
the file's SHA-256 whether it fsyncs on close or leaves that to the store."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

from prep import hashing, writeback


def test_start_writeback_leaves_the_bytes_alone(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    path = tmp_path / "file"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.write(fd, data)
        for offset, size in ((0, 1 << 20), (1 << 20, 2 << 20), (0, 0), (5 << 20, 4096)):  # past the end too
            writeback.start_writeback(fd, offset, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    assert writeback.available() == sys.platform.startswith("linux")


@pytest.mark.parametrize("durable", [True, False])
def test_hashing_writer_digest_crosses_writeback_steps(tmp_path: Path, durable: bool) -> None:
    pieces = [os.urandom(size) for size in (5 << 20, 7 << 20, 1, 0, 3 << 20)]  # crosses 8 MiB twice
    path = tmp_path / "out"
    with hashing.HashingWriter(path, durable) as writer:
        for piece in pieces:
            writer.write(piece)
    joined = b"".join(pieces)
    assert writer.digest == hashing.Digest(hashlib.sha256(joined).hexdigest(), len(joined))
    assert path.read_bytes() == joined
    with pytest.raises(FileExistsError):
        hashing.HashingWriter(path)  # never overwrites: a new file under a new name each time
