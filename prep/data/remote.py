"""A snapshot read straight from a store (S3 or local) through the node-local cache: each shard is
fetched into the cache on first need (prep.data.nodecache), pinned while rows are read out of it by
position (prep.data.pread), and read from the verified cache file; nothing is read from a file
before it is proven, and a pinned file cut short or unreadable meanwhile is a prep error naming it
(the pin is dropped, so the next read opens the object again, and fetches it again if it is short).

When the cache reader holds every shard a batch reads already (a warm cache), the rows are read
under one pin call. Otherwise they are read shard by shard in ascending shard order, the order
prep.data.plan predicts; a batch then uses one shard at a time, so a cache of one shard (the
largest) is enough to progress.
"""

from __future__ import annotations

import numpy as np

from prep.data.nodecache import Hold, NodeCache
from prep.data.plan import Need
from prep.data.pread import Pieces, read_in_groups, read_pieces
from prep.data.source import SnapshotSource
from prep.errors import PrepError, UsageError
from prep.formats.megatron import parse_index
from prep.storage.backend import Store
from prep.store.snapshots import Snapshot, resolve


class CachedSource(SnapshotSource):
    """A SnapshotSource whose shard files come from a NodeCache rather than a folder."""

    def __init__(self, snapshot: Snapshot, cache: NodeCache) -> None:
        artifacts = snapshot.manifest["artifacts"]
        super().__init__(snapshot, {a["path"]: cache.path_of(a["sha256"]) for a in artifacts})
        self.cache = cache
        sizes = {a["path"]: int(a["size"]) for a in artifacts}
        label = snapshot.id[:19]
        self.bin_needs = [Need(s.bin_sha256, sizes[s.bin_name], f"{label} {s.bin_name}") for s in self.shards]
        self.idx_needs = [Need(s.idx_sha256, sizes[s.idx_name], f"{label} {s.idx_name}") if s.idx_name else None
                          for s in self.shards]

    @classmethod
    def resolve(cls, spec: str, store: Store, cache: NodeCache) -> CachedSource:
        """The snapshot `spec` names in `store`, read through `cache`."""
        return cls(resolve(store, spec), cache)

    def shard_span(self, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and last shard each token range [start, start + length) touches."""
        first = np.searchsorted(self.token_starts, starts, side="right") - 1
        last = np.searchsorted(self.token_starts, starts + np.maximum(lengths, 1) - 1, side="right") - 1
        return first, last

    def needs(self, starts: np.ndarray, lengths: np.ndarray) -> list[Need]:
        """The bin objects these token ranges read, in the order `_read_parts` reads them."""
        return [self.bin_needs[shard] for shard in self._touched(*self.shard_span(starts, lengths))]

    @staticmethod
    def _touched(first: np.ndarray, last: np.ndarray) -> list[int]:
        if not len(first):
            return []
        if (first == last).all():
            return sorted(set(first.tolist()))
        return sorted({s for a, b in zip(first.tolist(), last.tolist()) for s in range(a, b + 1)})

    def _read_parts(self, pieces: Pieces) -> list[bytes]:
        """The pieces' bytes: at once when this reader holds every shard they read already, else one
        pinned shard at a time."""
        parts = self._read_held_all(pieces)
        return parts if parts is not None else self._read_by_shard(pieces)

    def _read_held_all(self, pieces: Pieces) -> list[bytes] | None:
        """The hit path: when every shard is pinned already, read the pieces under one pin call; None
        (nothing read) otherwise."""
        touched = sorted(set(pieces.shards))
        holds = self.cache.pin_held([self.bin_needs[shard] for shard in touched])
        if holds is None:
            return None
        return self._read_held(dict(zip(touched, holds)), pieces)

    def _read_by_shard(self, pieces: Pieces) -> list[bytes]:
        """The pieces read shard by shard in ascending order, each shard pinned (fetched if need be) in turn."""
        return read_in_groups(pieces, 1, self._read_pinned)

    def _read_pinned(self, shards: list[int], pieces: Pieces) -> list[bytes]:
        """One shard's pieces, from its file pinned (fetched if need be) for the read."""
        (shard,) = shards
        return self._read_held({shard: self.cache.acquire(self.bin_needs[shard])}, pieces)

    def _read_held(self, holds: dict[int, Hold], pieces: Pieces) -> list[bytes]:
        """Read the pieces from pinned files (by shard), then release the pins; after a failed read (a
        file cut short, EIO) drop them, so the next read opens (and if need be fetches) the objects again."""
        try:
            parts = read_pieces({shard: hold.file for shard, hold in holds.items()}, pieces)
        except PrepError:
            self.cache.release(*holds.values())
            self.cache.unpin_idle(self.bin_needs[shard].sha256 for shard in holds)
            raise
        self.cache.release(*holds.values())
        return parts

    def document_bounds(self) -> np.ndarray:
        """Document starts from the `.idx` files, each fetched through the cache."""
        starts = [np.zeros(0, dtype=np.int64)]
        for need, base in zip(self.idx_needs, self.token_starts[:-1].tolist()):
            if need is None:
                raise UsageError(f"{self.id}: documents mode needs the .idx files")
            with self.cache.using(need) as hold:  # read into memory once, from the proven file's descriptor
                lengths = parse_index(hold.file.read(), str(hold.path)).lengths.astype(np.int64)
            starts.append(base + np.concatenate(([0], np.cumsum(lengths)[:-1])))
        # A reader may idle long before its first batch (a DataLoader's main-process reader never reads):
        # pins kept on the .idx files would hold the room every other user of the cache waits for.
        self.cache.unpin_idle(need.sha256 for need in self.idx_needs if need is not None)
        return np.concatenate([*starts, [self.total_tokens]])
