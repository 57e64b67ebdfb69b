"""A deletion request applied in a tokenize task: the documents whose id or text hash the build's
exclusion table holds (prep.inputs.exclusions) are dropped from each batch before any document
step sees it, so they get no intermediate row, no entries, no step outcome and no token.

The table's two sorted hash columns are read in place (numpy views of the stored bytes) and
binary-searched, so a list of millions of entries costs each worker one read of its object and
no Python set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from prep.inputs.exclusions import HASH_BYTES, id_hash, unpack
from prep.stages.textcolumns import TextColumns
from prep.workfiles.columns import to_strings

_KEY = np.dtype(f"S{HASH_BYTES}")  # compared as bytes: every value is the full 16 bytes, so none loses a NUL


def _column(view: memoryview) -> np.ndarray[Any, Any]:
    return np.frombuffer(view, dtype=_KEY)


def _members(table: np.ndarray[Any, Any], keys: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Which of `keys` the sorted `table` holds."""
    if not len(table) or not len(keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.minimum(np.searchsorted(table, keys), len(table) - 1)
    return np.asarray(table[at] == keys, dtype=bool)


class Excluder:
    """Drops the documents a build's exclusion table names, counting them."""

    def __init__(self, table: bytes) -> None:
        ids, texts = unpack(table)
        self.ids, self.texts = _column(ids), _column(texts)
        self.excluded = 0
        self.excluded_bytes = 0

    def matches(self, batch: TextColumns) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which documents of the batch the table names, by text hash or by id."""
        found = _members(self.texts, np.frombuffer(batch.text_hashes(), dtype=_KEY))
        if len(self.ids) and batch.ids.null_count != len(batch.ids):
            named = [(index, doc_id) for index, doc_id in enumerate(to_strings(batch.ids)) if doc_id is not None]
            keys = np.array([id_hash(doc_id) for _, doc_id in named], dtype=_KEY)
            hits = _members(self.ids, keys)
            found[np.asarray([index for index, _ in named], dtype=np.int64)] |= hits
        return found

    def apply(self, batch: TextColumns) -> TextColumns:
        """The batch less the documents the table names (the batch itself when it names none)."""
        if not len(batch):
            return batch
        found = self.matches(batch)
        if not found.any():
            return batch
        self.excluded += int(found.sum())
        self.excluded_bytes += int(np.diff(batch.offsets)[found].sum())
        return batch.masked(~found)
