"""A document's stored text and token ids, for `prep show --at --text/--tokens`.

Both are read from the document's tokenize intermediate: the exact bytes shard assembly copied
into every format (.txt members, .bin sequences), so this works for bin-only snapshots too and
needs neither the tokenizer file (it may have moved or changed since) nor the input corpus (it
may have been edited). Fail closed: the intermediate is proven to hash to its name
(prep.history.documents.verified_object), and the text is checked against the xxh3-128 text hash
the tokenize stage recorded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from prep.errors import IntegrityError
from prep.history.documents import DocumentOrigin, SnapshotRecords, verified_object
from prep.storage.backend import Store
from prep.workfiles.columns import FALSE, row_of, scalar_of, to_numbers
from prep.workfiles.intermediate import Intermediate, read_texts

_COLUMNS = ["row", "text_bytes", "n_tokens", "text_offset", "tokens_offset"]


@dataclass(frozen=True)
class Content:
    """A document's text, and its token ids as its shard sequence holds them (EOS last)."""

    text: str
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """The content as reports print it."""
        return {"text": self.text, "tokens": list(self.tokens)}


def _row_offsets(intermediate: Intermediate, row: int, source: str) -> dict[str, int]:
    """The intermediate's metadata of row `row` (read batch by batch: bounded memory)."""
    for batch in intermediate.batches():
        hits = to_numbers(pc.fill_null(pc.equal(batch.column("row"), scalar_of(row, pa.int64())), FALSE))
        for hit in np.flatnonzero(hits):
            return {name: int(value) for name, value in row_of(batch, int(hit)).items()}
    raise IntegrityError(f"the intermediate of {source} has no row {row}")


def document_content(store: Store, records: SnapshotRecords, origin: DocumentOrigin) -> Content:
    """The text and tokens of `origin`, read from its tokenize intermediate and checked."""
    task = records.tasks[origin.part]
    path = verified_object(store, task.output, f"the tokenize intermediate of {task.source}")
    intermediate = Intermediate(path, _COLUMNS)
    meta = _row_offsets(intermediate, origin.row, task.source)
    dtype = intermediate.token_dtype
    if (meta["text_bytes"], meta["n_tokens"]) != (origin.text_bytes, origin.tokens):
        raise IntegrityError(f"{task.output}: row {origin.row} of {task.source} does not match its trace")
    fd = os.open(path, os.O_RDONLY)
    try:
        text = os.pread(fd, meta["text_bytes"], meta["text_offset"])
        raw = os.pread(fd, meta["n_tokens"] * dtype.itemsize, meta["tokens_offset"])
    finally:
        os.close(fd)
    if len(text) != meta["text_bytes"] or xxhash.xxh3_128_digest(text).hex() != origin.text_hash:
        raise IntegrityError(f"{task.output}: the text of {origin.id!r} does not match its recorded xxh3-128 hash")
    if len(raw) != meta["n_tokens"] * dtype.itemsize:
        raise IntegrityError(f"{task.output}: the tokens of {origin.id!r} are cut short")
    eos = int(records.snapshot.manifest["tokenizer"]["eos_id"])
    tokens = tuple(int(t) for t in np.frombuffer(raw, dtype=dtype)) + (eos,)
    return Content(text.decode("utf-8", "surrogateescape"), tokens)


def document_text(store: Store, records: SnapshotRecords, origin: DocumentOrigin) -> bytes:
    """The UTF-8 text of `origin`, read from its tokenize intermediate (proven, and the text checked
    against its recorded xxh3-128), without its tokens."""
    task = records.tasks[origin.part]
    path = verified_object(store, task.output, f"the tokenize intermediate of {task.source}")
    (text,) = read_texts(path, np.array([origin.row], dtype=np.int64))
    if xxhash.xxh3_128_digest(text).hex() != origin.text_hash:
        raise IntegrityError(f"{task.output}: the text of {origin.id!r} does not match its recorded xxh3-128 hash")
    return text
