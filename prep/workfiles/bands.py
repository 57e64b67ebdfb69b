"""Bands objects: a part's LSH band hashes, one record per (document, band), sorted by hash, with a
prefix index over the hash's top bits so a near-duplicate bucket task reads its bucket of every
part with one read each (docs/manifests.md, "Bands objects").

A tokenize task writes its part's bands batch by batch (`BandsWriter`); the records are held until
the part ends, 20 bytes each: documents x bands x 20 bytes (300k short documents in 8 bands, 48 MB;
96 MB in the 16 of `verify = true`) plus the sort's permutation. A document is named by its `row`,
the record's row in its part, as the part's entries and intermediate name it: a bucket task numbers
it `part ordinal << 32 | row`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from prep.hashing import Digest
from prep.workfiles.indexed import IndexedFile, RecordFormat, write_indexed

BAND_DTYPE = np.dtype([("hash", "<u8"), ("key_hi", "<u8"), ("row", "<u4")])
"""One (document, band): the band hash (`lsh.band_hashes`, the band mixed in), the document's
order key high word (which order bucket it is in) and its row in the part; 20 bytes."""
BANDS = RecordFormat(b"PREPBND1", "prep.bands/1", BAND_DTYPE, "hash", 4, "bands object")
Array = np.ndarray[Any, Any]


class BandsWriter:
    """Collects a part's band records batch by batch; `close` sorts and writes them."""

    def __init__(self, path: Path, bands: int) -> None:
        self.path, self.bands = path, bands
        self._pieces: list[Array] = []

    def add(self, rows: Array, key_hi: Array, hashes: Array) -> None:
        """The records of a batch's documents: their rows, order key high words and band hashes
        (documents x bands, `lsh.band_hashes`)."""
        if hashes.shape != (len(rows), self.bands) or len(key_hi) != len(rows):
            raise ValueError(f"{hashes.shape} band hashes for {len(rows)} rows of {self.bands} bands")
        records = np.empty(hashes.size, dtype=BAND_DTYPE)
        records["hash"] = hashes.ravel()
        records["key_hi"] = np.repeat(np.asarray(key_hi, dtype=np.uint64), self.bands)
        records["row"] = np.repeat(np.asarray(rows, dtype=np.uint32), self.bands)
        self._pieces.append(records)

    def close(self) -> Digest:
        """Write the bands object: the records sorted by (hash, row), the same bytes whatever the batches."""
        records = np.concatenate(self._pieces) if self._pieces else np.zeros(0, dtype=BAND_DTYPE)
        self._pieces = []
        records = records[np.lexsort((records["row"], records["hash"]))]
        return write_indexed(self.path, BANDS, records, {"bands": self.bands})


def open_bands(path: Path, fd: int | None = None) -> IndexedFile:
    """A bands object opened for reading (`read_bucket`, `read_all`)."""
    return IndexedFile.open(path, BANDS, fd)
