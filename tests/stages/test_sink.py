"""The shard file writer: direct writes carried across unaligned chunks, read back from the disk and
compared; a disk that returns other bytes fails the write; filesystems without O_DIRECT, or that
refuse a direct write, get buffered writes that are not claimed as read back."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError, StorageIOError
from prep.hashing import Digest
from prep.stages import sink


def write(path: Path, chunks: list[bytes], zeroed: bool = False) -> tuple[sink.ChunkSink, bytes]:
    """Write `chunks` through a sink; returns it (closed) and the bytes it was given."""
    writer = sink.ChunkSink(path)
    expected = bytearray()
    for data in chunks:
        view = writer.buffer(len(data), zeroed)
        if zeroed:
            assert view.tobytes() == bytes(len(data))
        view[:] = data
        expected += data
        writer.write(view)
    digest = writer.close()
    assert digest.sha256 == hashlib.sha256(expected).hexdigest() and digest.size == len(expected)
    return writer, bytes(expected)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 20000), max_size=12), zeroed=st.booleans(), seed=st.integers(0, 255))
def test_any_chunk_sizes_give_the_bytes_written_read_back_from_the_disk(
        tmp_path_factory: pytest.TempPathFactory, sizes: list[int], zeroed: bool, seed: int) -> None:
    path = tmp_path_factory.mktemp("sink") / "out.bin"
    chunks = [bytes((seed + i + j) % 251 + 1 for j in range(size)) for i, size in enumerate(sizes)]
    writer, expected = write(path, chunks, zeroed)
    assert path.read_bytes() == expected
    assert writer.read_back  # this filesystem takes O_DIRECT


def test_a_chunk_larger_than_the_buffers_grows_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink, "CHUNK_BYTES", 4096)
    chunks = [b"a" * 5000, b"b" * 70000, b"c" * 3]
    writer, expected = write(tmp_path / "out.bin", chunks)
    assert (tmp_path / "out.bin").read_bytes() == expected and writer.read_back


def test_a_disk_that_returns_other_bytes_fails_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.preadv

    def flipped(fd: int, buffers: list[Any], offset: int) -> int:
        got = real(fd, buffers, offset)
        buffers[0][got // 2] ^= 0x01
        return got

    monkeypatch.setattr(os, "preadv", flipped)
    with pytest.raises(IntegrityError, match="the disk returned other bytes"):
        write(tmp_path / "out.bin", [b"x" * 10000, b"y" * 9000])


def test_a_buffer_changed_after_its_write_fails_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's buffer reused too early (the bytes on disk are no longer the bytes laid out) is caught."""
    real = os.pwrite

    def write_then_spoil(fd: int, data: Any, offset: int) -> int:
        done = real(fd, data, offset)
        data[0] ^= 0x01
        return done

    monkeypatch.setattr(os, "pwrite", write_then_spoil)
    with pytest.raises(IntegrityError, match="the disk returned other bytes"):
        write(tmp_path / "out.bin", [b"x" * 10000, b"y" * 9000])


def test_the_digest_is_of_the_bytes_read_back(tmp_path: Path) -> None:
    hashed: list[bytes] = []

    class Spy:
        def __init__(self) -> None:
            self.inner = hashlib.sha256()

        def update(self, data: Any) -> None:
            hashed.append(bytes(data))
            self.inner.update(data)

        def hexdigest(self) -> str:
            return self.inner.hexdigest()

    writer = sink.ChunkSink(tmp_path / "out.bin")
    writer._hasher = Spy()  # type: ignore[assignment]  # noqa: SLF001
    expected = b"a" * 9000 + b"b" * 5000 + b"c" * 3
    for data in (expected[:9000], expected[9000:14000], expected[14000:]):
        view = writer.buffer(len(data), zeroed=False)
        view[:] = data
        writer.write(view)
    assert writer.close().sha256 == hashlib.sha256(expected).hexdigest()
    assert writer.read_back and b"".join(hashed) == expected
    assert all(len(piece) % sink.ALIGNMENT == 0 for piece in hashed[:-1])  # whole blocks as read, then the tail


def test_without_read_back_chunks_go_direct_and_are_hashed_from_the_buffer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--no-readback`: nothing is read back from the disk, the digest is of the bytes laid out, and
    the file is not claimed as read back (the publish would read it like any other)."""
    def no_reads(fd: int, buffers: list[Any], offset: int) -> int:
        raise AssertionError("read back although not asked to")

    monkeypatch.setattr(os, "preadv", no_reads)
    writer = sink.ChunkSink(tmp_path / "out.bin", read_back=False)
    expected = b"a" * 9000 + b"b" * 5000 + b"c" * 3
    for data in (expected[:9000], expected[9000:14000], expected[14000:]):
        view = writer.buffer(len(data), zeroed=False)
        view[:] = data
        writer.write(view)
    assert writer.close() == Digest(hashlib.sha256(expected).hexdigest(), len(expected))
    assert (tmp_path / "out.bin").read_bytes() == expected and not writer.read_back


def test_a_short_read_back_fails_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: 0)
    with pytest.raises(IntegrityError, match=str(tmp_path / "out.bin")):
        write(tmp_path / "out.bin", [b"x" * 10000])


def test_a_filesystem_without_o_direct_gets_buffered_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.open

    def no_direct(path: Any, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, mode)

    monkeypatch.setattr(os, "open", no_direct)
    writer, expected = write(tmp_path / "out.bin", [b"p" * 5000, b"q" * 123])
    assert (tmp_path / "out.bin").read_bytes() == expected
    assert not writer.read_back  # nothing was read back: the publish reads it


def test_a_refused_direct_write_goes_on_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite
    calls = []

    def refuse_first(fd: int, data: Any, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", refuse_first)
    writer, expected = write(tmp_path / "out.bin", [b"r" * 9000, b"s" * 5000, b"t" * 7])
    assert (tmp_path / "out.bin").read_bytes() == expected
    assert not writer.read_back and len(calls) > 1


def test_a_full_disk_names_the_file_and_leaves_the_threads_stopped(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: Any, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    writer = sink.ChunkSink(tmp_path / "out.bin")
    view = writer.buffer(8192, zeroed=True)
    writer.write(view)
    with pytest.raises(StorageIOError) as caught:
        writer.close()
    assert str(caught.value) == f"writing {tmp_path / 'out.bin'}: No space left on device"
    assert all(pool._shutdown for pool in writer._pools)  # noqa: SLF001 (the threads are gone)
