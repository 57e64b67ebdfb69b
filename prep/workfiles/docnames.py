"""How a document is named in shard members and reports: its 1-based record line and its id.

(Layout-1 snapshots also had a shuffle stage here, one task over the whole corpus; builds now
order documents in buckets, prep/stages/order.py.)"""

from __future__ import annotations


def record_line(fmt: str, line_offset: int, row: int) -> int:
    """The 1-based line (JSON Lines) or record number (Parquet, Arrow; 1 for a text file)."""
    return line_offset + row + 1


def document_id(doc_id: str | None, source: str, line: int) -> str:
    """The recorded id, or `<source>:<line>` when the pipeline has no id field."""
    return doc_id if doc_id is not None else f"{source}:{line}"
