"""A snapshot read straight from a store (S3 or local) through the node-local cache: each shard is
fetched into the cache on first need (prep.data.cache), pinned while rows are copied out of it,
and read from the verified cache file; nothing is read from a file before it is proven.

When the cache reader holds every shard a batch reads already (a warm cache), the rows are copied
under one pin call. Otherwise they are copied shard by shard in ascending shard order, the order
prep.data.plan predicts; a batch then uses one shard at a time, so a cache of one shard (the
largest) is enough to progress.
"""

from __future__ import annotations

import numpy as np

from prep.data.cache import NodeCache
from prep.data.plan import Need
from prep.data.source import SnapshotSource
from prep.errors import UsageError
from prep.formats.megatron import read_index
from prep.storage.base import Store
from prep.store.snapshots import Snapshot, resolve


class CachedSource(SnapshotSource):
    """A SnapshotSource whose shard files come from a NodeCache rather than a folder."""

    def __init__(self, snapshot: Snapshot, cache: NodeCache) -> None:
        artifacts = snapshot.manifest["artifacts"]
        super().__init__(snapshot, {a["path"]: cache.path_of(a["sha256"]) for a in artifacts})
        self.cache = cache
        self._shard_tokens = np.diff(self.token_starts)
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
        """The bin objects these token ranges read, in the order `_fill` reads them."""
        return [self.bin_needs[shard] for shard in self._touched(*self.shard_span(starts, lengths))]

    @staticmethod
    def _touched(first: np.ndarray, last: np.ndarray) -> list[int]:
        if not len(first):
            return []
        if (first == last).all():
            return sorted(set(first.tolist()))
        return sorted({s for a, b in zip(first.tolist(), last.tolist()) for s in range(a, b + 1)})

    def _fill(self, out: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Rows of out.shape[1] tokens from each of `starts`: at once when this reader holds every shard
        they read already, else one pinned shard at a time."""
        length = out.shape[1]
        if len(starts) and (starts.min() < 0 or starts.max() + length > self.total_tokens):
            raise IndexError(f"tokens outside 0..{self.total_tokens}")
        first = np.searchsorted(self.token_starts, starts, side="right") - 1
        offsets = starts - self.token_starts[first]
        if not self._fill_held(out, first, offsets):
            last = np.searchsorted(self.token_starts, starts + max(length, 1) - 1, side="right") - 1
            self._fill_by_shard(out, starts, first, last)
        self.bytes_read += out.size * self.dtype.itemsize
        return out

    def _fill_held(self, out: np.ndarray, first: np.ndarray, offsets: np.ndarray) -> bool:
        """The hit path: when no row crosses a shard and every shard is pinned already, copy the rows
        under one pin call; False (nothing copied) otherwise."""
        length = out.shape[1]
        if len(first) and (offsets + length > self._shard_tokens[first]).any():
            return False
        shards = first.tolist()
        touched = sorted(set(shards))
        holds = self.cache.pin_held([self.bin_needs[shard] for shard in touched])
        if holds is None:
            return False
        try:
            views: dict[int, np.ndarray] = {shard: hold.view(self.dtype) for shard, hold in zip(touched, holds)}
            for row, (shard, offset) in enumerate(zip(shards, offsets.tolist())):
                out[row] = views[shard][offset:offset + length]
            del views  # no view may outlive the pins: a map is closed when its pin is dropped
        finally:
            self.cache.release(*holds)
        return True

    def _fill_by_shard(self, out: np.ndarray, starts: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        """Rows copied shard by shard in ascending order, each shard pinned (fetched if need be) in turn."""
        length = out.shape[1]
        begins = starts.tolist()
        inside: dict[int, list[tuple[int, int]]] = {}  # shard -> (row, offset in the shard)
        crossing: dict[int, list[int]] = {}  # shard -> rows that only partly lie in it
        for row, (a, b) in enumerate(zip(first.tolist(), last.tolist())):
            if a == b:
                inside.setdefault(a, []).append((row, begins[row] - int(self.token_starts[a])))
            for shard in range(a, b + 1) if a != b else ():
                crossing.setdefault(shard, []).append(row)
        for shard in sorted(inside.keys() | crossing.keys()):
            base, end = int(self.token_starts[shard]), int(self.token_starts[shard + 1])
            hold = self.cache.acquire(self.bin_needs[shard])
            try:
                tokens = hold.view(self.dtype)
                for row, offset in inside.get(shard, ()):
                    out[row] = tokens[offset:offset + length]
                for row in crossing.get(shard, ()):
                    lo, hi = max(begins[row], base), min(begins[row] + length, end)
                    out[row, lo - begins[row]:hi - begins[row]] = tokens[lo - base:hi - base]
                del tokens  # no view may outlive the pin: the map is closed when the pin is dropped
            finally:
                self.cache.release(hold)

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        return self._fill(np.empty((len(starts), length), dtype=np.int64), np.asarray(starts, dtype=np.int64))

    def tokens(self, start: int, count: int) -> np.ndarray:
        if start < 0 or start + count > self.total_tokens:
            raise IndexError(f"tokens {start}..{start + count} outside 0..{self.total_tokens}")
        row: np.ndarray = self._fill(np.empty((1, count), dtype=self.dtype), np.asarray([start], dtype=np.int64))[0]
        return row

    def document_bounds(self) -> np.ndarray:
        """Document starts from the `.idx` files, each fetched through the cache."""
        starts = [np.zeros(0, dtype=np.int64)]
        for need, base in zip(self.idx_needs, self.token_starts[:-1].tolist()):
            if need is None:
                raise UsageError(f"{self.id}: documents mode needs the .idx files")
            with self.cache.using(need) as hold:
                lengths = read_index(hold.path).lengths.astype(np.int64)
            starts.append(base + np.concatenate(([0], np.cumsum(lengths)[:-1])))
        # A reader may idle long before its first batch (a DataLoader's main-process reader never reads):
        # pins kept on the .idx files would hold the room every other user of the cache waits for.
        self.cache.unpin_idle(need.sha256 for need in self.idx_needs if need is not None)
        return np.concatenate([*starts, [self.total_tokens]])
