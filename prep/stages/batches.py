"""A read task's documents in batches of columns, for the tokenize stage: JSON Lines through the
block reader (prep.stages.jsonblocks), every other format from its per-document reader."""

from __future__ import annotations

from collections.abc import Iterator

from prep.stages.jsonblocks import jsonl_chunks
from prep.stages.read import BadRecord, ReadTask, read_documents, translated
from prep.stages.textcolumns import TextColumns, chunks_of, rebatch


def _document_rows(task: ReadTask, stats: dict[str, int]) -> Iterator[tuple[int, str | None, str, bytes] | BadRecord]:
    for item in read_documents(task, stats):
        yield item if isinstance(item, BadRecord) else (item.row, item.id, item.text, item.data)


def read_batches(task: ReadTask, stats: dict[str, int], max_documents: int,
                 max_bytes: int) -> Iterator[TextColumns | BadRecord]:
    """The documents `read_documents` gives, in batches closed by the document that brings a batch
    to `max_bytes` of text or `max_documents` documents. A bad record comes as soon as it is read,
    before the batch of the documents read before it."""
    chunks = jsonl_chunks(task, stats) if task.source.format == "jsonl" else chunks_of(_document_rows(task, stats))
    return translated(task, rebatch(chunks, max_documents, max_bytes))

