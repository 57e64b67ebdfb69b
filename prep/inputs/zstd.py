"""zstd input that fails when cut short: zstandard's decoder returns a stream cut inside a
frame as a shorter output, without an error, so the compressed bytes pass through a walker of
the frame and block headers (skipping block data by its size, never decoding it) that tells
whether they end on a frame boundary."""

from __future__ import annotations

import io
import struct
from typing import TYPE_CHECKING, BinaryIO, Protocol, cast

from prep.errors import InputError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


def open_zstd(raw: BinaryIO, location: str, read_size: int) -> BinaryIO:
    """The decompressed bytes of a .zst stream; reading past its end raises InputError if it was cut."""
    import zstandard

    frames = _ZstdFrames(raw, location)
    # the reader only calls read() and close() of its source
    reader = zstandard.ZstdDecompressor().stream_reader(cast(BinaryIO, frames), read_size=read_size,
                                                        read_across_frames=True, closefd=True)
    return io.BufferedReader(_ZstdReader(reader, frames), buffer_size=read_size)


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # up to 0x184D2A5F: skippable frames (user data the decoder ignores)
_U32 = struct.Struct("<I")
# Frame header bytes after the descriptor byte, by its value: window descriptor (absent for a
# single segment), dictionary id (0, 1, 2 or 4 bytes), frame content size (0/1, 2, 4 or 8 bytes).
_HEADER_REST = tuple((0 if fhd & 0x20 else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if fhd & 0x20 else 0), 2, 4, 8)[fhd >> 6]
                     for fhd in range(256))
_MAGIC, _BLOCK, _UNKNOWN = 0, 1, 2  # what _ZstdFrames expects next after the bytes it skips


class _ZstdFrames:
    """The compressed bytes, passed on unchanged while their frame and block headers are walked."""

    def __init__(self, raw: BinaryIO, location: str) -> None:
        self._raw = raw
        self._location = location
        self._offset = 0  # file offset of the first byte of the next read
        self._skip = 0  # bytes of block data, checksum or skippable payload still to pass
        self._stage = _MAGIC
        self._checksum = False  # the current frame ends with a 4-byte content checksum
        self._tail = b""  # the start of a header the last read cut
        self._frame_start = 0

    def read(self, size: int = -1) -> bytes:
        """The next compressed bytes, their headers walked."""
        data = self._raw.read(size)
        if data and self._stage != _UNKNOWN:
            self._walk(data)
        self._offset += len(data)
        return data

    def _walk(self, data: bytes) -> None:
        """Follow the frame structure through the next bytes of the stream."""
        buf = self._tail + data if self._tail else data
        base = self._offset - len(self._tail)
        pos, end, stage, checksum, frame_start = self._skip, len(buf), self._stage, self._checksum, self._frame_start
        while pos < end:
            if stage == _BLOCK:
                if end - pos < 3:
                    break
                header = buf[pos] | buf[pos + 1] << 8 | buf[pos + 2] << 16
                pos += 3 + (1 if header & 6 == 2 else header >> 3)  # an RLE block holds one byte
                if header & 1:  # the frame's last block
                    pos += 4 if checksum else 0
                    stage = _MAGIC
            else:
                frame_start = base + pos
                if end - pos < 5:  # a zstd frame's magic number and header descriptor
                    break
                magic = _U32.unpack_from(buf, pos)[0]
                if magic == _ZSTD_MAGIC:
                    descriptor = buf[pos + 4]
                    checksum = bool(descriptor & 4)
                    pos += 5 + _HEADER_REST[descriptor]
                    stage = _BLOCK
                elif magic & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:
                    if end - pos < 8:  # its magic number and payload size
                        break
                    pos += 8 + _U32.unpack_from(buf, pos + 4)[0]
                else:
                    stage = _UNKNOWN  # not a frame: the decoder fails on it
                    break
        self._skip, self._tail = (pos - end, b"") if pos >= end else (0, buf[pos:])
        self._stage, self._checksum, self._frame_start = stage, checksum, frame_start

    def check_complete(self) -> None:
        """Raise InputError unless the stream read so far ends on a frame boundary."""
        if self._stage == _UNKNOWN or (self._stage == _MAGIC and not self._skip and not self._tail):
            return
        raise InputError(f"{self._location}: truncated zstd stream: the file ends after {self._offset} bytes, "
                         f"inside the frame starting at byte {self._frame_start}")

    def close(self) -> None:
        """Close the underlying stream."""
        self._raw.close()


class _Decompressing(Protocol):
    """What _ZstdReader uses of zstandard's stream reader."""

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        """Decompress into `buffer`; 0 at the end of the data."""

    def tell(self) -> int:
        """Bytes decompressed so far."""

    def close(self) -> None:
        """Close the reader and its source."""


class _ZstdReader(io.RawIOBase):
    """Decompressed zstd data that fails at its end if the compressed stream was cut mid-frame."""

    def __init__(self, reader: _Decompressing, frames: _ZstdFrames) -> None:
        self._reader = reader
        self._frames = frames

    def readable(self) -> bool:
        """True: a stream to read."""
        return True

    def tell(self) -> int:
        """Bytes decompressed so far."""
        return self._reader.tell()

    def readinto(self, buffer: WriteableBuffer) -> int:
        """Decompress into `buffer`; at the end of the data, check the stream was complete."""
        count = self._reader.readinto(buffer)
        if count == 0 and memoryview(buffer).nbytes:
            self._frames.check_complete()
        return count

    def close(self) -> None:
        """Close the decompressor and the compressed stream."""
        if not self.closed:
            self._reader.close()
        super().close()
