"""The step outcomes file of one document step over one tokenize part: every document the step
dropped (why, and the texts of the first few) or changed (its new text). It is what `prep trace`
and `prep show --dropped` read, and what a later build replays instead of running the step again
when the step and those before it are unchanged (docs/build.md, "Steps and reuse").

An Arrow IPC file, one record batch per tokenize batch in which the step dropped or changed a
document, rows in input order. Columns: `row` (the document's row in its part: its line is the
part's line offset + row + 1), `id` (null without an id field), `reason` (why it was dropped;
null: changed), `detail` (what about the document made the step drop it, when the step says),
`text` (changed: the new text; dropped: the text for the first TEXTS_PER_STEP documents the step
dropped in the part, null for the rest, so the file grows by some tens of bytes a dropped document)
`note` (with on_error = "skip": the message of a document the step's code raised on) and
`metadata` (the metadata keys the step set on a document it kept, as one JSON object in the
metadata spelling, prep.formats.jsonspelling; null when it set none). Written batch by batch as
the task goes, so its memory is one batch's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from prep.errors import IntegrityError
from prep.formats.jsonspelling import spell
from prep.hashing import Digest, digest_file
from prep.steps.protocol import Change, Drop, Outcome
from prep.workfiles.intermediate import io_errors

TEXTS_PER_STEP = 16
SCHEMA = pa.schema([("row", pa.int64()), ("id", pa.string()), ("reason", pa.string()), ("detail", pa.string()),
                    ("text", pa.large_string()), ("note", pa.string()), ("metadata", pa.large_string())])


class OutcomesWriter:
    """Appends what one step dropped or changed, batch by batch, to its part's step outcomes file."""

    def __init__(self, path: Path, durable: bool) -> None:
        self.path, self.durable = path, durable
        self._samples = 0
        with io_errors("writing", path):
            self._sink = open(path, "wb")  # noqa: SIM115 -- closed by close() or abort()
            self._writer = pa.ipc.new_file(self._sink, SCHEMA)

    def add(self, rows: Sequence[int], ids: pa.Array, outcomes: Sequence[Outcome], text: Callable[[int], bytes],
            notes: Mapping[int, str]) -> None:
        """The outcomes of a batch whose document i is at `rows[i]` with id `ids[i]` and UTF-8 text
        `text(i)`; `notes` holds the messages of the documents the step raised on, by index."""
        touched = [index for index, outcome in enumerate(outcomes) if outcome is not None]
        if not touched:
            return
        reasons: list[str | None] = []
        details: list[str | None] = []
        texts: list[str | None] = []
        metadata: list[str | None] = []
        for index in touched:
            outcome = outcomes[index]
            if isinstance(outcome, Drop):
                reasons.append(outcome.reason)
                details.append(outcome.detail or None)
                sampled = self._samples < TEXTS_PER_STEP
                self._samples += sampled
                texts.append(text(index).decode("utf-8", "surrogatepass") if sampled else None)
                metadata.append(None)
            else:
                reasons.append(None)
                details.append(None)
                texts.append(outcome.text if isinstance(outcome, Change) else outcome)
                metadata.append(spell(dict(outcome.metadata)) if isinstance(outcome, Change) else None)
        batch = pa.record_batch([pa.array([rows[index] for index in touched], pa.int64()),
                                 ids.take(pa.array(touched, pa.int64())).cast(pa.string()),
                                 pa.array(reasons, pa.string()), pa.array(details, pa.string()),
                                 pa.array(texts, pa.large_string()),
                                 pa.array([notes.get(index) for index in touched], pa.string()),
                                 pa.array(metadata, pa.large_string())], schema=SCHEMA)
        with io_errors("writing", self.path):
            self._writer.write_batch(batch)

    def close(self) -> Digest:
        """Finish the file (made durable when asked) and return its digest."""
        with io_errors("writing", self.path):
            self._writer.close()
            self._sink.flush()
            if self.durable:
                os.fsync(self._sink.fileno())
            self._sink.close()
        return digest_file(self.path)

    def abort(self) -> None:
        """Close the file without finishing it (the task failed; its caller removes it)."""
        try:
            self._writer.close()
        finally:
            self._sink.close()


def read_outcomes(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of a step outcomes file, in the order they were written."""
    with io_errors("reading", path):
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        for index in range(reader.num_record_batches):
            yield reader.get_batch(index)


class OutcomesReplay:
    """A step's outcomes over a part as a later build reads them back, batch after batch, in
    place of running the step: its file's bytes (checked against their object id by the caller)."""

    def __init__(self, data: bytes, where: str) -> None:
        self.where = where
        try:
            reader = pa.ipc.open_file(pa.py_buffer(data))
            if reader.schema != SCHEMA:
                raise IntegrityError(f"{where}: not a step outcomes file")
            self._rows = _entries(reader)
        except pa.ArrowInvalid as exc:
            raise IntegrityError(f"{where}: not a step outcomes file ({exc})") from None
        self._next: _Entry | None = next(self._rows, None)

    def take(self, rows: np.ndarray) -> tuple[list[Outcome], dict[int, str]]:
        """The outcomes of the batch of documents at `rows` (ascending, after every earlier
        batch's), and the notes of those the step raised on, by index."""
        outcomes: list[Outcome] = [None] * len(rows)
        notes: dict[int, str] = {}
        last = int(rows[-1]) if len(rows) else -1
        while self._next is not None and self._next.row <= last:
            entry = self._next
            index = int(np.searchsorted(rows, entry.row))
            if index == len(rows) or int(rows[index]) != entry.row:
                raise IntegrityError(f"{self.where}: names row {entry.row}, which this part's steps do not reach")
            outcomes[index] = entry.outcome()
            if entry.note is not None:
                notes[index] = entry.note
            self._next = next(self._rows, None)
        return outcomes, notes

    def finish(self) -> None:
        """Fail when the file names documents after the part's last one."""
        if self._next is not None:
            raise IntegrityError(f"{self.where}: names row {self._next.row}, past this part's documents")


@dataclass(frozen=True)
class _Entry:
    """One row of a step outcomes file."""

    row: int
    reason: str | None
    detail: str | None
    text: str | None
    note: str | None
    metadata: str | None

    def outcome(self) -> Outcome:
        """The step's outcome for this document, as the step made it."""
        if self.reason is not None:
            return Drop(self.reason, self.detail or "")
        if self.metadata is None:
            return self.text
        return Change(self.text, tuple(sorted(json.loads(self.metadata).items())))


def _entries(reader: pa.ipc.RecordBatchFileReader) -> Iterator[_Entry]:
    """The file's rows one by one, a record batch made Python objects at a time."""
    for index in range(reader.num_record_batches):
        batch = reader.get_batch(index)
        columns = [batch.column(name).to_pylist() for name in ("row", "reason", "detail", "text", "note", "metadata")]
        for row, reason, detail, text, note, metadata in zip(*columns):
            if reason is None and text is None and metadata is None:
                raise IntegrityError("a step outcomes file names a changed document without its change")
            yield _Entry(row, reason, detail, text, note, metadata)
