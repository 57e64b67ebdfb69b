"""prep.hashing: digests of regular files only, never a block on a FIFO or a device."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from prep.hashing import Digest, digest_descriptor, digest_file
from tests.helpers import within


def test_digest_file_hashes_a_regular_file(tmp_path: Path) -> None:
    data = os.urandom(5 << 20) + b"tail"
    path = tmp_path / "f"
    path.write_bytes(data)
    assert digest_file(path) == Digest(hashlib.sha256(data).hexdigest(), len(data))


@pytest.mark.parametrize("kind", ["fifo", "folder", "dev-zero-symlink"])
def test_digest_file_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(path)  # opened without O_NONBLOCK this would block for ever: no writer
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # hashed by reading, this would never end
    with within(5), pytest.raises(OSError) as raised:
        digest_file(path)
    assert raised.value.errno == errno.EINVAL


def test_digest_descriptor_hashes_from_the_start_and_leaves_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abcdef")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 3, os.SEEK_SET)
        assert digest_descriptor(fd) == Digest(hashlib.sha256(b"abcdef").hexdigest(), 6)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 3
    finally:
        os.close(fd)
