"""A read task's documents in batches of columns, for the tokenize stage: JSON Lines through the
block reader (prep.stages.jsonblocks), Parquet and Arrow record batches taken as they are when
every value is usable, everything else from its per-document reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from prep.stages.jsonblocks import jsonl_chunks, valid_utf8
from prep.stages.read import BadRecord, ReadTask, Row, batch_documents, read_documents, record_batches, translated
from prep.stages.textcolumns import TextColumns, chunks_of, rebatch
from prep.workfiles.columns import string_bytes


def _rows(items: Iterator[Any]) -> Iterator[Row | BadRecord]:
    for item in items:
        yield item if isinstance(item, BadRecord) else (item.row, item.id, item.text, item.data, item.metadata)


def _utf8_column(column: pa.Array) -> tuple[bytes, np.ndarray[Any, np.dtype[np.int64]]] | None:
    """A string column's UTF-8 bytes and n + 1 offsets from 0, when it has no nulls and valid UTF-8."""
    if column.null_count or not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    blob, offsets = string_bytes(column)
    return (blob, offsets) if valid_utf8(blob) else None


def _id_column(task: ReadTask, batch: pa.RecordBatch) -> pa.Array | None:
    """The batch's ids as strings spelled as str() spells them: only string and integer ids qualify."""
    if task.id_field is None:
        return pa.nulls(batch.num_rows, pa.string())
    column = batch.column(task.id_field)
    if column.null_count or not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                                 or pa.types.is_integer(column.type)):
        return None
    ids = column.cast(pa.string())
    return ids if _utf8_column(ids) is not None else None


def _over_the_bound(task: ReadTask, blob: bytes, offsets: np.ndarray[Any, np.dtype[np.int64]]) -> bool:
    """Whether a text of the batch is over [input] max_document_bytes (the per-document path names it)."""
    return len(blob) > task.max_document_bytes and int(np.diff(offsets).max()) > task.max_document_bytes


def _table_chunks(task: ReadTask) -> Iterator[TextColumns | BadRecord]:
    """Each record batch as columns when every text and id is usable and no metadata is read, else
    document by document (a document's metadata is spelled from its Python values)."""
    for first_row, batch in record_batches(task):
        texts = _utf8_column(batch.column(task.text_field)) if not task.metadata_fields else None
        ids = _id_column(task, batch) if texts is not None else None
        if texts is None or ids is None or _over_the_bound(task, *texts):
            yield from chunks_of(_rows(batch_documents(task, batch, first_row)))
        else:
            rows = np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
            yield TextColumns(rows, ids, texts[0], texts[1])


def read_batches(task: ReadTask, stats: dict[str, int], max_documents: int,
                 max_bytes: int) -> Iterator[TextColumns | BadRecord]:
    """The documents `read_documents` gives, in batches closed by the document that brings a batch
    to `max_bytes` of text or `max_documents` documents. A bad record comes as soon as it is read,
    before the batch of the documents read before it."""
    if task.source.format == "jsonl":
        chunks = jsonl_chunks(task, stats)
    elif task.source.format in ("parquet", "hf"):
        chunks = _table_chunks(task)
    else:
        chunks = chunks_of(_rows(read_documents(task, stats)))
    return translated(task, rebatch(chunks, max_documents, max_bytes))
