"""Consecutive documents of a read task as columns: every text's UTF-8 in one buffer with offsets.

The tokenize stage works on these whole (hashing, tokenizing, writing), so a batch costs a few
buffer operations instead of several Python objects per document; a `str` of a text is made only
when something asks for it (an error message, the tokenizer cross-check's sample).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from prep.stages.read import BadRecord, Row
from prep.tokenizer.spans import SpanTexts
from prep.workfiles.columns import metadata_column, string_column

Offsets = np.ndarray[Any, np.dtype[np.int64]]


@dataclass(frozen=True)
class TextColumns:
    """Documents `rows[i]` (line or row of the task), `ids[i]`, UTF-8 text `blob[offsets[i]:offsets[i + 1]]`,
    and with metadata fields configured `metadata[i]`, the document's metadata (prep.inputs.metadata)."""

    rows: np.ndarray[Any, np.dtype[np.int64]]
    ids: pa.Array  # strings, all null when the task reads no ids
    blob: bytes
    offsets: Offsets
    metadata: pa.Array | None = None  # large strings, never null; None when the build carries no metadata

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def from_rows(cls, rows: Sequence[int], ids: list[str | None], texts: Sequence[bytes],
                  metadata: pa.Array | None = None) -> TextColumns:
        """Columns of documents given one by one (their texts as UTF-8)."""
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)), out=offsets[1:])
        return cls(np.asarray(rows, dtype=np.int64), string_column(ids), b"".join(texts), offsets, metadata)

    @classmethod
    def concat(cls, parts: Sequence[TextColumns]) -> TextColumns:
        """The documents of `parts`, one part after another."""
        if len(parts) == 1:
            return parts[0]
        bases = np.cumsum([0] + [len(part.blob) for part in parts[:-1]])
        offsets = np.concatenate([[0]] + [part.offsets[1:] + base for part, base in zip(parts, bases)])
        metadata = [part.metadata for part in parts if part.metadata is not None]
        return cls(np.concatenate([part.rows for part in parts]), pa.concat_arrays([part.ids for part in parts]),
                   b"".join(part.blob for part in parts), offsets.astype(np.int64),
                   pa.concat_arrays(metadata) if metadata else None)

    def slice(self, start: int, end: int) -> TextColumns:
        """Documents [start, end) as columns of their own."""
        if start == 0 and end == len(self):
            return self
        first, last = int(self.offsets[start]), int(self.offsets[end])
        metadata = self.metadata.slice(start, end - start) if self.metadata is not None else None
        return TextColumns(self.rows[start:end], self.ids.slice(start, end - start), self.blob[first:last],
                           self.offsets[start:end + 1] - first, metadata)

    def with_empty_metadata(self) -> TextColumns:
        """These documents, each with metadata `{}` (a build whose steps set the only metadata keys)."""
        return dataclasses.replace(self, metadata=metadata_column([b"{}"] * len(self)))

    def metadata_of(self, kept: np.ndarray[Any, Any]) -> pa.Array | None:
        """The metadata of the documents `kept` (a mask, or indices in order); None without metadata."""
        if self.metadata is None:
            return None
        return self.metadata.filter(pa.array(kept)) if kept.dtype == bool else self.metadata.take(pa.array(kept))

    def masked(self, keep: np.ndarray[Any, np.dtype[np.bool_]]) -> TextColumns:
        """The documents where `keep` is True: the columns masked, the buffer joined from the texts kept."""
        bounds = self.offsets.tolist()
        view = memoryview(self.blob)
        blob = b"".join([view[bounds[index]:bounds[index + 1]] for index in np.flatnonzero(keep).tolist()])
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(np.diff(self.offsets)[keep], out=offsets[1:])
        return TextColumns(self.rows[keep], self.ids.filter(pa.array(keep)), blob, offsets, self.metadata_of(keep))

    def data(self, index: int) -> bytes:
        """Document `index`'s text as UTF-8."""
        return self.blob[int(self.offsets[index]):int(self.offsets[index + 1])]

    def texts(self) -> SpanTexts:
        return SpanTexts(self.blob, self.offsets)

    def text_hashes(self) -> bytes:
        """Every text's 16-byte XXH3-128 digest, one after another."""
        view = memoryview(self.blob)
        bounds = self.offsets.tolist()
        return b"".join([xxhash.xxh3_128_digest(view[start:end]) for start, end in zip(bounds[:-1], bounds[1:])])


def chunks_of(items: Iterable[Row | BadRecord], most: int = 4096) -> Iterator[TextColumns | BadRecord]:
    """Documents given one by one (a Document's fields) as chunks of at most `most`, bad records
    passed on in their place."""
    def columns(rows: list[Row]) -> TextColumns:
        metadata = [row[4] for row in rows if row[4] is not None]
        return TextColumns.from_rows([row[0] for row in rows], [row[1] for row in rows], [row[3] for row in rows],
                                     metadata_column(metadata) if metadata else None)

    rows: list[Row] = []
    for item in items:
        if rows and (isinstance(item, BadRecord) or len(rows) >= most):
            yield columns(rows)
            rows = []
        if isinstance(item, BadRecord):
            yield item
        else:
            rows.append(item)
    if rows:
        yield columns(rows)


def rebatch(items: Iterable[TextColumns | BadRecord], max_documents: int,
            max_bytes: int) -> Iterator[TextColumns | BadRecord]:
    """Documents regrouped into batches closed by the document that brings a batch to `max_bytes`
    of text or `max_documents` documents, wherever the chunks they came in were cut; a bad record
    is passed on as soon as it comes, before the batch of the documents that came before it."""
    pending: list[TextColumns] = []
    documents, size = 0, 0
    for item in items:
        if isinstance(item, BadRecord):
            yield item
            continue
        at = 0
        while at < len(item):
            through = item.offsets[at + 1:] - item.offsets[at]  # text bytes from `at` through each document
            by_bytes = int(np.searchsorted(through, max_bytes - size, side="left"))
            last = min(by_bytes, max_documents - documents - 1)
            if last >= len(item) - at:
                pending.append(item.slice(at, len(item)))
                documents += len(item) - at
                size += int(through[-1])
                break
            pending.append(item.slice(at, at + last + 1))
            yield TextColumns.concat(pending)
            pending, documents, size = [], 0, 0
            at += last + 1
    if documents:
        yield TextColumns.concat(pending)
