"""The dropped-documents file of a tokenize part: every document a step dropped, which step and
why, with the texts of the first few each step dropped (what `prep trace` and `prep show
--dropped` read).

An Arrow IPC file, one record batch per tokenize batch that lost documents, columns `row` (the
document's row in its part: its line is the part's line offset + row + 1), `id` (null without an
id field), `step` (the step's index in `[[steps]]`), `reason`, `detail` (what about the document
made the step drop it, when the step says; else null) and `text`: the document's text for
the first TEXTS_PER_STEP documents each step dropped in the part, null for the rest, so the file
grows by some tens of bytes a dropped document however long the texts (a sample is what a user
judges a threshold by; the inputs hold the rest). Written batch by batch as the task goes, so
its memory is one batch's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from prep.hashing import Digest, digest_file
from prep.workfiles.intermediate import io_errors

TEXTS_PER_STEP = 16
SCHEMA = pa.schema([("row", pa.int64()), ("id", pa.string()), ("step", pa.int32()), ("reason", pa.string()),
                    ("detail", pa.string()), ("text", pa.large_string())])


class DroppedWriter:
    """Appends the documents each step drops to a part's dropped-documents file."""

    def __init__(self, path: Path, durable: bool) -> None:
        self.path, self.durable = path, durable
        self._texts: dict[int, int] = {}
        with io_errors("writing", path):
            self._sink = open(path, "wb")  # noqa: SIM115 -- closed by close() or abort()
            self._writer = pa.ipc.new_file(self._sink, SCHEMA)

    def add(self, step: int, rows: Sequence[int], ids: pa.Array, reasons: Sequence[str], details: Sequence[str],
            texts: Sequence[bytes]) -> None:
        """Documents one step dropped from a batch, in batch order (their texts: the first few kept;
        a detail of "" is stored as null)."""
        room = max(0, TEXTS_PER_STEP - self._texts.get(step, 0))
        kept = [text.decode("utf-8", "surrogatepass") for text in texts[:room]]
        self._texts[step] = self._texts.get(step, 0) + len(kept)
        batch = pa.record_batch([pa.array(rows, pa.int64()), ids.cast(pa.string()),
                                 pa.array([step] * len(rows), pa.int32()), pa.array(reasons, pa.string()),
                                 pa.array([detail or None for detail in details], pa.string()),
                                 pa.array(kept + [None] * (len(rows) - len(kept)), pa.large_string())], schema=SCHEMA)
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


def read_dropped(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of a dropped-documents file, in the order they were written."""
    with io_errors("reading", path):
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        for index in range(reader.num_record_batches):
            yield reader.get_batch(index)
