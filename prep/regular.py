"""Opening a file that must be a regular one without ever blocking: a FIFO or a device planted
under a name prep reads (a store's key, a tokenizer, DEST's own records) would otherwise hang the
open or the read for ever."""

from __future__ import annotations

import errno
import os
import stat


def open_regular(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """A read-only descriptor on `path`; OSError(EINVAL, "not a regular file") for anything else
    (a FIFO, a folder, a device) and, unless `follow`, OSError(ELOOP) for a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of regular file `path`, opened as `open_regular` opens it; OSError(EFBIG), having
    read at most `limit` + 1 bytes, when it holds more than `limit`."""
    with os.fdopen(open_regular(path), "rb") as stream:
        size = os.fstat(stream.fileno()).st_size
        # hazard: the size may understate (a file growing meanwhile), so the read is bounded as well
        data = stream.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data
