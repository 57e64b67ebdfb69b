"""Read documents from one input task: a whole file, a byte range of a JSON Lines file, or a
range of Parquet row groups. Bad records raise InputError naming file and line/row, or, under
the skip policy, are yielded as BadRecord so the caller can count and record them."""

from __future__ import annotations

import functools
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from prep.config import DEFAULT_MAX_DOCUMENT_BYTES
from prep.errors import ConfigError, InputError, PrepError
from prep.inputs import jsonvalues
from prep.inputs.lines import LongLine, iter_lines_in_range
from prep.inputs.metadata import metadata_json, table_metadata
from prep.inputs.sources import SourceFile, local_copy, open_decoded, open_raw
from prep.inputs.tables import InvalidUTF8, arrow_batches, column_values
from prep.stages.readtask import BadRecord as BadRecord
from prep.stages.readtask import Document as Document
from prep.stages.readtask import ReadTask as ReadTask
from prep.stages.readtask import document, utf8

RANGE_BYTES = 32 * 2**20


def plan_read_tasks(source: SourceFile, text_field: str, id_field: str | None,
                    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
                    metadata_fields: tuple[str, ...] = ()) -> list[ReadTask]:
    """Split a file into tasks of about RANGE_BYTES so one huge file is not one task."""
    range_bytes = RANGE_BYTES
    if metadata_fields and source.format == "text":
        raise ConfigError(f"{source.location}: input.metadata_fields: a text file has no fields to read metadata "
                          "from; leave metadata_fields out, or read JSON Lines, Parquet or Arrow")

    def task(part: int, start: int, end: int) -> ReadTask:
        return ReadTask(source, part, start, end, text_field, id_field, max_document_bytes, metadata_fields)

    if source.format == "jsonl" and not source.compressed and source.size > range_bytes:
        starts = list(range(0, source.size, range_bytes))
        return [task(i, s, min(s + range_bytes, source.size)) for i, s in enumerate(starts)]
    if source.format == "parquet":
        import pyarrow.parquet as pq

        with input_errors(source.location), _seekable(source) as handle:
            meta = pq.ParquetFile(handle).metadata
            groups = [(meta.row_group(i).total_byte_size, i) for i in range(meta.num_row_groups)]
        tasks: list[ReadTask] = []
        first, acc = 0, 0
        for size, index in groups:
            acc += size
            if acc >= range_bytes:
                tasks.append(task(len(tasks), first, index + 1))
                first, acc = index + 1, 0
        if first < len(groups) or not tasks:
            tasks.append(task(len(tasks), first, len(groups)))
        return tasks
    return [task(0, 0, source.size)]


def _seekable(source: SourceFile) -> BinaryIO:
    """A seekable stream of the file (Parquet and Arrow readers need one): the local file or
    spooled S3 copy, else a temporary download."""
    local = local_copy(source)
    if local is not None:
        return open_raw(source)
    spool = tempfile.TemporaryFile()
    with open_raw(source) as stream:
        shutil.copyfileobj(stream, spool, 4 << 20)
    spool.seek(0)
    return spool


def line_number(task: ReadTask, local_line: int) -> int:
    """The 1-based line number in the file of a task's local line (counts earlier lines)."""
    if task.start == 0 or task.source.format != "jsonl":
        return local_line + 1
    return _lines_before(task) + local_line + 1


@functools.lru_cache(maxsize=4)
def _lines_before(task: ReadTask) -> int:
    """How many lines start before the task's first (once per task, not per bad record): those ended
    before byte `start - 1`, and the one holding it (the range before owns it, wherever it ends)."""
    with open_raw(task.source) as stream:
        newlines, remaining = 0, task.start - 1
        while remaining > 0:
            chunk = stream.read(min(remaining, 4 << 20))
            if not chunk:
                break
            newlines += chunk.count(b"\n")
            remaining -= len(chunk)
    return newlines + 1


def _field_text(record: Any, field: str) -> str:
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if field not in record:
        raise ValueError(f"missing text field {field!r}")
    value = record[field]
    if not isinstance(value, str):
        raise ValueError(f"text field {field!r} is {type(value).__name__}, not a string")
    return value


def _field_id(record: dict[str, Any], field: str | None) -> str | None:
    if field is None:
        return None
    value = record.get(field)
    if value is None or isinstance(value, (dict, list, bool)):
        raise ValueError(f"missing or non-scalar id field {field!r}")
    return str(value)


_UTF8_BOM = b"\xef\xbb\xbf"
# Deeper lines go to json.loads, which recurses per level and raises RecursionError near 1000 levels.
_MAX_FAST_DEPTH = 100
# Longer lines go to json.loads: simdjson's buffers take several times the longest line, for the task.
_MAX_FAST_LINE_BYTES = 16 << 20


def preload_fast_parser() -> None:
    """Import the JSON parsers now (a worker's warm-up) rather than in a first task."""
    import pyarrow.json  # noqa: F401 -- the block reader's (prep.stages.jsonblocks)

    try:
        import simdjson  # noqa: F401
    except ImportError:
        pass


def fast_line_parser() -> Callable[[bytes], object] | None:
    """A JSON parser for one task from the optional pysimdjson (2-3x faster than json on long
    texts), or None when it is not installed."""
    try:
        import simdjson
    except ImportError:
        return None
    parser = simdjson.Parser(max_capacity=_MAX_FAST_LINE_BYTES)  # not thread-safe: one per task
    return lambda raw: parser.parse(raw, True)  # plain dicts and lists, no proxies into the parser


def _shallow(record: dict[str, Any]) -> bool:
    """True when lists and objects in `record` nest at most _MAX_FAST_DEPTH levels deep."""
    level: list[Any] = [record]
    for _ in range(_MAX_FAST_DEPTH):
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
        if not level:
            return True
    return False


_Fields = tuple[str | None, str, bytes | None]  # a record's id, text and metadata


def _metadata(record: dict[str, Any], task: ReadTask) -> bytes | None:
    """The record's metadata when the task reads some; ValueError names a field it cannot spell."""
    return metadata_json(record, task.metadata_fields) if task.metadata_fields else None


def _fast_fields(parse: Callable[[bytes], object], raw: bytes, task: ReadTask) -> _Fields | None:
    """The line's (id, text, metadata) when `parse` surely reads it as json.loads does, else None (ask json).

    Only clean successes are taken, so every error message stays json's. simdjson rejects all
    that json rejects and more (lone surrogate escapes, NaN, integers beyond 64 bits), and keeps
    the last of duplicate keys like json, except that it accepts a leading BOM and nesting deeper
    than json can recurse: both are sent to json."""
    if raw.startswith(_UTF8_BOM):
        return None
    try:
        record = parse(raw)
    except Exception:  # noqa: BLE001 -- ValueError (also for long lines), RuntimeError, UnicodeDecodeError
        return None
    # The walk visits only the record's objects and lists: counting brackets in the line instead
    # scanned every byte of the text twice (a tenth of a tokenize task on long documents).
    if type(record) is not dict or not _shallow(record):
        return None
    text = record.get(task.text_field)
    if type(text) is not str:
        return None
    if task.id_field is None:
        return None, text, _metadata(record, task)
    value = record.get(task.id_field)
    if type(value) is not str and type(value) is not int:  # floats and the rest: as json reads them
        return None
    return str(value), text, _metadata(record, task)


def _fast_document(parse: Callable[[bytes], object], raw: bytes, local: int, task: ReadTask) -> Document | None:
    """The line's Document when `parse` surely reads it as json.loads does, else None (see _fast_fields)."""
    fields = _fast_fields(parse, raw, task)
    return None if fields is None else document(local, *fields)


def _json_fields(raw: bytes, task: ReadTask) -> _Fields:
    """The line's (id, text, metadata) as json.loads reads it; ValueError says why the line is bad."""
    try:
        text_line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid UTF-8 at byte {exc.start}") from None
    try:
        record = jsonvalues.loads(text_line)
    except json.JSONDecodeError as exc:
        message = exc.msg.removesuffix(" at")  # "Invalid control character at"
        raise ValueError(f"malformed JSON: {message} at column {exc.colno}") from None
    except RecursionError:  # json recurses per level of nesting
        raise ValueError("malformed JSON: nested too deeply to read") from None
    text = _field_text(record, task.text_field)
    return _field_id(record, task.id_field), text, _metadata(record, task)


def _json_document(raw: bytes, local: int, task: ReadTask) -> Document:
    """The line's Document as json.loads reads it; ValueError says why the line is bad."""
    return document(local, *_json_fields(raw, task))


def _line_document(parse: Callable[[bytes], object] | None, raw: bytes, local: int, task: ReadTask) -> Document:
    """The Document of one JSON Lines line, from the fast parser when it is sure, else from json."""
    found = _fast_document(parse, raw, local, task) if parse is not None else None
    return found if found is not None else _json_document(raw, local, task)


Row = tuple[int, str | None, str, bytes, bytes | None]  # a Document's fields


def long_line(task: ReadTask, local: int, length: int) -> BadRecord:
    """The bad record of local line `local`, `length` bytes: over [input] max_document_bytes."""
    return BadRecord(local, task.too_long(length), line=line_number(task, local))


def line_rows(task: ReadTask, parse: Callable[[bytes], object] | None, lines: Iterable[bytes | LongLine],
              first_local: int = 0) -> Iterator[Row | BadRecord]:
    """The Document fields (or BadRecord) of each non-blank line; the first is local line `first_local`."""
    for local, raw in enumerate(lines, first_local):
        if isinstance(raw, LongLine) or len(raw) > task.max_document_bytes:
            yield long_line(task, local, raw.length if isinstance(raw, LongLine) else len(raw))
            continue
        if not raw.strip():
            continue
        try:
            fields = _fast_fields(parse, raw, task) if parse is not None else None
            doc_id, text, metadata = fields if fields is not None else _json_fields(raw, task)
            data = utf8(doc_id, text)
        except ValueError as exc:
            yield BadRecord(local, str(exc), line=line_number(task, local))
            continue
        yield local, doc_id, text, data, metadata


def _jsonl_rows(task: ReadTask, stats: dict[str, int]) -> Iterator[Row | BadRecord]:
    """Every line's Document fields (one function call per line on the fast parser's path)."""
    counted = [0]

    def counting(lines: Iterator[bytes | LongLine]) -> Iterator[bytes | LongLine]:
        for raw in lines:
            counted[0] += 1
            yield raw

    with open_decoded(task.source) as stream:
        end = task.end if not task.source.compressed else sys.maxsize
        lines = iter_lines_in_range(stream, task.start, end, task.max_document_bytes)
        try:
            yield from line_rows(task, fast_line_parser(), counting(lines))
        finally:
            stats["lines"] = counted[0]


def _jsonl(task: ReadTask, stats: dict[str, int]) -> Iterator[Document | BadRecord]:
    for item in _jsonl_rows(task, stats):
        yield item if isinstance(item, BadRecord) else Document(*item)


def _text(task: ReadTask, stats: dict[str, int]) -> Iterator[Document | BadRecord]:
    with open_decoded(task.source) as stream:
        data = stream.read(task.max_document_bytes + 1)  # no more: a longer file is a bad record
    if reason := task.too_long(len(data), at_least=True):
        yield BadRecord(-1, reason)
        return
    try:
        yield Document(0, None, data.decode("utf-8"), data)
    except UnicodeDecodeError as exc:
        yield BadRecord(-1, f"invalid UTF-8 at byte {exc.start}")


def _row_problem(task: ReadTask, text: Any, doc_id: Any) -> str | None:
    """Why a table row cannot be a document, or None when it can."""
    if isinstance(text, InvalidUTF8):
        return f"text field {task.text_field!r} is not valid UTF-8 (byte {text.start})"
    if not isinstance(text, str):
        return f"text field {task.text_field!r} is null or not a string"
    if isinstance(doc_id, InvalidUTF8):
        return f"id field {task.id_field!r} is not valid UTF-8 (byte {doc_id.start})"
    if isinstance(doc_id, bytes):  # str() would spell it "b'...'"
        return f"id field {task.id_field!r} is binary, not a string or a number"
    if task.id_field and (doc_id is None or isinstance(doc_id, (dict, list, bool))):
        return f"missing or non-scalar id field {task.id_field!r}"
    return None


def _table_metadata(task: ReadTask, batch: Any) -> list[bytes | ValueError] | list[None]:
    """Each row's metadata (or why it has none) when the task reads some, from the batch's columns."""
    if not task.metadata_fields:
        return [None] * batch.num_rows
    names = batch.schema.names
    columns = {field: column_values(batch.column(field)) for field in task.metadata_fields if field in names}
    return table_metadata(columns, task.metadata_fields, batch.num_rows)


def batch_documents(task: ReadTask, batch: Any, first_row: int) -> Iterator[Document | BadRecord]:
    """The Documents (or BadRecords) of one Arrow record batch whose first row is `first_row`."""
    texts = column_values(batch.column(task.text_field))
    ids = column_values(batch.column(task.id_field)) if task.id_field else [None] * len(texts)
    metadata = _table_metadata(task, batch)
    for row, (text, doc_id, found_metadata) in enumerate(zip(texts, ids, metadata), first_row):
        problem = _row_problem(task, text, doc_id)
        if problem is not None or isinstance(found_metadata, ValueError):
            yield BadRecord(row, problem or str(found_metadata))  # the text's and id's problems first
            continue
        try:
            found = document(row, None if doc_id is None else str(doc_id), text, found_metadata)
        except ValueError as exc:
            yield BadRecord(row, str(exc))
            continue
        reason = task.too_long(len(found.data))
        yield BadRecord(row, reason) if reason else found


def _require_columns(task: ReadTask, names: list[str]) -> list[str]:
    """The columns the task reads: its text and id columns (which must be there, once each), then
    the metadata fields the file has (a field it lacks is left out of every row's metadata)."""
    wanted = [task.text_field] + ([task.id_field] if task.id_field else [])
    for column in wanted + [field for field in task.metadata_fields if field in names]:
        if column not in names:
            raise InputError(f"{task.source.location}: no column {column!r} (columns: {', '.join(names)})")
        if names.count(column) > 1:
            raise InputError(f"{task.source.location}: column {column!r} appears {names.count(column)} times")
    return wanted + [field for field in task.metadata_fields if field in names]


def _numbered(batches: Iterator[Any], first_row: int) -> Iterator[tuple[int, Any]]:
    for batch in batches:
        yield first_row, batch
        first_row += batch.num_rows


def _parquet_batches(task: ReadTask) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    with _seekable(task.source) as handle:
        parquet = pq.ParquetFile(handle)
        columns = _require_columns(task, parquet.schema_arrow.names)
        if task.end > parquet.metadata.num_row_groups:  # planned from other metadata: rewritten since
            raise InputError(f"{task.source.location}: changed during the build; rerun to pick up the new content")
        first_row = sum(parquet.metadata.row_group(i).num_rows for i in range(task.start))
        groups = list(range(task.start, task.end))
        yield from _numbered(parquet.iter_batches(batch_size=4096, row_groups=groups, columns=columns), first_row)


def _arrow_batches(task: ReadTask) -> Iterator[tuple[int, Any]]:
    with _seekable(task.source) as handle:
        names, batches = arrow_batches(handle)
        _require_columns(task, names)
        yield from _numbered(batches, 0)


def record_batches(task: ReadTask) -> Iterator[tuple[int, Any]]:
    """A Parquet or Arrow ("hf") task's record batches, each with the file row of its first row."""
    return _parquet_batches(task) if task.source.format == "parquet" else _arrow_batches(task)


def _tables(task: ReadTask, stats: dict[str, int]) -> Iterator[Document | BadRecord]:
    for first_row, batch in record_batches(task):
        yield from batch_documents(task, batch, first_row)


_READERS = {"jsonl": _jsonl, "text": _text, "parquet": _tables, "hf": _tables}


@contextmanager
def input_errors(location: str) -> Iterator[None]:
    """I/O and format errors raised inside become InputError naming `location`."""
    try:
        yield
    except PrepError:
        raise
    except (OSError, EOFError) as exc:
        raise InputError(f"{location}: cannot read: {exc}") from None
    except Exception as exc:  # pyarrow and zstandard raise their own error types
        if type(exc).__module__.startswith(("pyarrow", "zstd", "zstandard")) or isinstance(exc, ValueError):
            raise InputError(f"{location}: cannot read: {str(exc).splitlines()[0]}") from None
        raise


def translated(task: ReadTask, items: Iterator[Any]) -> Iterator[Any]:
    """`items`, with I/O and format errors turned into InputError naming the task's file."""
    with input_errors(task.source.location):
        yield from items


def read_documents(task: ReadTask, stats: dict[str, int]) -> Iterator[Document | BadRecord]:
    """Every record of the task in file order; I/O and format errors become InputError.
    `stats["lines"]` ends as the number of lines a JSON Lines task consumed."""
    return translated(task, _READERS[task.source.format](task, stats))
