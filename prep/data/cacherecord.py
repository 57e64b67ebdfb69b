"""The node-local cache's record of proven files, `.prep/verified.jsonl` (pull's PullRecord), kept
bounded by what the cache holds.

Every fetch appends a line, so a long run through a cache smaller than its data would grow the
record without bound (600 steps: 390 KB of record beside 235 KB of objects). The record is
compacted, under `cache.lock`, to one line per cached file it proves: when a reader opens the
cache, and whenever it has doubled in size (plus SLACK_BYTES) since it was last looked at. A
compaction writes a temporary and renames it over the record, so a crash leaves the old record
or the new one whole; a torn or malformed line is dropped, costing only a rehash.

A file with rules of its own (what it proves, when it is rewritten, how a crash leaves it), so a
module of its own: the cache (prep.data.nodecache) appends to it and asks it to compact, the cache's
folder (prep.data.cachedir) only holds it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from prep.transfer.paths import TEMP_MARKER
from prep.transfer.shares import PullRecord, discard, load_record, stamp

SLACK_LINES = 64  # lines a record may hold beyond twice the files it proves before it is rewritten
SLACK_BYTES = SLACK_LINES * 256  # the same, in bytes (a cache line is about 230)


class CacheRecord(PullRecord):
    """The cache's `.prep/verified.jsonl`: appended to at each fetch, compacted by `tend`."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._looked_at = self._size()  # its size when `tend` last looked (or when it was loaded)

    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def add(self, path: str, sha256: str, info: os.stat_result) -> None:
        """Record a proven file, appending to the record now at its name (another user's compaction
        may have replaced the file this one appended to: lines written there would be lost)."""
        with self._lock:
            if self._fd is not None and not _same_file(self._fd, self.path):
                os.close(self._fd)
                self._fd = None
        super().add(path, sha256, info)

    def overgrown(self) -> bool:
        """Whether the record has more than doubled (plus SLACK_BYTES) since `tend` last looked: one stat."""
        return self._size() > 2 * self._looked_at + SLACK_BYTES

    def tend(self, present: Mapping[str, os.stat_result]) -> None:
        """Compact the record when it holds more than twice the lines of the cached files it proves
        (plus SLACK_LINES); call under cache.lock, with `present` the cache's files as it reads them."""
        with self._lock:
            for leftover in self.path.parent.glob(f".{self.path.name}{TEMP_MARKER}*"):
                discard(leftover)  # of a compaction killed midway: compactions run under cache.lock
            found, lines = load_record(self.path)
            now = {name: stamp(info) for name, info in present.items()}
            kept = {name: entry for entries in (found, self.entries) for name, entry in entries.items()
                    if entry[0] == name and now.get(name) == entry[1]}
            if lines > 2 * len(kept) + SLACK_LINES:
                self.rewrite(kept)
                lines = len(kept)
            self.entries, self.lines = kept, lines
            self._looked_at = self._size()



def _same_file(fd: int, path: Path) -> bool:
    """Whether the open descriptor `fd` is the file at `path` now."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (found.st_ino, found.st_dev) == (held.st_ino, held.st_dev)
