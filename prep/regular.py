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
