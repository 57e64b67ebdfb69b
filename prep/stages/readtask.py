"""The values of reading one input task: the task itself (a file, a byte range of a JSON Lines
file, or a range of Parquet row groups, and how its records are read), a Document, a BadRecord."""

from __future__ import annotations

from dataclasses import dataclass

from prep.config import DEFAULT_MAX_DOCUMENT_BYTES
from prep.inputs.sources import SourceFile


@dataclass(frozen=True)
class ReadTask:
    """One unit of reading: [start, end) are byte offsets (jsonl) or row groups (parquet)."""

    source: SourceFile
    part: int
    start: int
    end: int
    text_field: str
    id_field: str | None
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    metadata_fields: tuple[str, ...] = ()  # the record's fields its document's metadata holds

    def describe(self) -> dict[str, object]:
        return {"source": self.source.rel, "sha256": self.source.sha256, "format": self.source.format,
                "part": self.part, "start": self.start, "end": self.end}

    def key_parts(self) -> tuple[object, ...]:
        """What of the task a tokenize key names: its input range and how its records are read (the
        metadata fields only when some are read, so a task without them keeps its key)."""
        metadata = (list(self.metadata_fields),) if self.metadata_fields else ()
        return self.describe(), self.text_field, self.id_field, self.max_document_bytes, *metadata

    def too_long(self, length: int, at_least: bool = False) -> str:
        """The bad-record reason of a record of `length` (or, `at_least`, more) bytes over the bound, else ''."""
        bound = f"[input] max_document_bytes ({self.max_document_bytes})"
        if length <= self.max_document_bytes:
            return ""
        return f"the record is more than {bound} bytes" if at_least else f"the record is {length} bytes, more than {bound}"


@dataclass(frozen=True)
class Document:
    row: int  # line (jsonl, 0-based within the task), row (parquet/hf, within the file), 0 (text)
    id: str | None
    text: str
    data: bytes  # the text as UTF-8
    metadata: bytes | None = None  # with metadata fields: the document's metadata (prep.inputs.metadata)


def utf8(doc_id: str | None, text: str) -> bytes:
    """The text as UTF-8, after checking that the id and text are encodable (no lone surrogates)."""
    if doc_id is not None and not doc_id.isascii():
        try:
            doc_id.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("id has an unpaired surrogate") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"text has an unpaired surrogate at character {exc.start}") from None


def document(row: int, doc_id: str | None, text: str, metadata: bytes | None = None) -> Document:
    """A Document, its text encoded once (ValueError naming an unpaired surrogate)."""
    return Document(row, doc_id, text, utf8(doc_id, text), metadata)


@dataclass(frozen=True)
class BadRecord:
    """A record that cannot be used: its 1-based line (JSON Lines) or 0-based row, and why."""

    row: int
    reason: str
    line: int | None = None

    def message(self, file_name: str) -> str:
        """`file:line: reason`, `file: row N: reason`, or `file: reason` for a whole file."""
        if self.line is not None:
            return f"{file_name}:{self.line}: {self.reason}"
        return f"{file_name}: row {self.row}: {self.reason}" if self.row >= 0 else f"{file_name}: {self.reason}"
