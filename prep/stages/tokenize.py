"""The tokenize stage, fused with reading: one pass over a task's records parses, hashes and
tokenizes every document and writes one intermediate file (prep.stages.intermediate).

Tokenization depends only on this task's file, never on others: global dedup decisions are
applied later, when shards are assembled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
import xxhash

from prep.errors import InputError
from prep.hashing import Digest
from prep.inputs.sources import check_unchanged
from prep.stages.intermediate import IntermediateWriter
from prep.stages.read import BadRecord, DocumentBatch, ReadTask, read_batches
from prep.stages.specs import TokenizeSettings
from prep.tokenizer import TokenizerInfo, load_tokenizer
from prep.tokenizer.crosscheck import documents_containing
from prep.tokenizer.engine import TokenizerEngine

BATCH_TEXT_BYTES = 8 * 2**20
BATCH_DOCUMENTS = 8192
MAX_BAD_RECORDS_LISTED = 100


@dataclass(frozen=True)
class TokenizeResult:
    """A task's intermediate file (local, not yet stored) and its counts."""

    path: Path
    digest: Digest
    summary: dict[str, Any]
    log: dict[str, Any] = field(default_factory=dict)


_ENGINES: dict[tuple[object, ...], tuple[TokenizerEngine, TokenizerInfo]] = {}


def _engine(settings: TokenizeSettings) -> tuple[TokenizerEngine, TokenizerInfo]:
    """One engine per worker process, keyed on the tokenizer's content hash, never its path."""
    cache_key = (settings.tokenizer_sha256, settings.eos, settings.encode_special_tokens,
                 settings.backend, settings.threads)
    if cache_key not in _ENGINES:
        path = Path(settings.tokenizer_path)
        tokenizer, info = load_tokenizer(path, settings.eos, settings.encode_special_tokens)
        if info.sha256 != settings.tokenizer_sha256:
            raise InputError(f"{path}: tokenizer file changed during the build")
        _ENGINES[cache_key] = (TokenizerEngine.create(settings.backend, path, tokenizer, info,
                                                      settings.threads), info)
    return _ENGINES[cache_key]


def warm_engine(tokenizer_path: str, eos: str, encode_special_tokens: bool, backend: str) -> None:
    """Load this process's engine for a tokenizer file before its first task needs it. Errors
    are ignored: the task that needs the tokenizer reports them properly."""
    try:
        _, info = load_tokenizer(Path(tokenizer_path), eos, encode_special_tokens)
        _engine(TokenizeSettings(tokenizer_path, info.sha256, eos, encode_special_tokens, backend, "fail"))
    except Exception:  # noqa: BLE001, S110 -- a warm-up must never fail the build
        pass


def _batches(task: ReadTask, on_error: str, bad: list[str], counts: dict[str, int]) -> Iterator[DocumentBatch]:
    for item in read_batches(task, counts, BATCH_DOCUMENTS, BATCH_TEXT_BYTES):
        if not isinstance(item, BadRecord):
            yield item
            continue
        if on_error == "fail":
            raise InputError(item.message(task.source.location))
        counts["bad_records"] += 1
        if len(bad) < MAX_BAD_RECORDS_LISTED:
            bad.append(item.message(task.source.rel))  # relative: summaries must not name machines


class _DocumentNames(Sequence[str]):
    """`source:part:row` of each document of a batch, spelled only when asked (an error, a seed)."""

    def __init__(self, task: ReadTask, rows: list[int]) -> None:
        self._prefix = f"{task.source.rel}:{task.part}:"
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self._prefix + str(row) for row in self._rows[index]]
        return self._prefix + str(self._rows[index])


def _check_ids(task: ReadTask, batch: DocumentBatch, seen: set[str]) -> None:
    """Fail on an id seen before in this part, naming the first repeat's row."""
    fresh = {doc_id for doc_id in batch.ids if doc_id is not None}
    if len(fresh) == len(batch.ids) - batch.ids.count(None) and fresh.isdisjoint(seen):
        seen |= fresh
        return
    for row, doc_id in zip(batch.rows, batch.ids):
        if doc_id is not None:
            if doc_id in seen:
                raise InputError(f"{task.source.location}: duplicate id {doc_id!r} (row/line {row + 1} of this part)")
            seen.add(doc_id)


def run_tokenize(task: ReadTask, settings: TokenizeSettings, out_path: Path, durable: bool = True) -> TokenizeResult:
    """Read, hash and tokenize every document of `task` into the new local intermediate file
    `out_path` (fsynced unless `durable` is False, for a file whose store makes it durable when put)."""
    engine, info = _engine(settings)
    dtype = np.dtype(info.dtype)
    counts = {"documents": 0, "tokens": 0, "text_bytes": 0, "bad_records": 0, "special_token_documents": 0,
              "lines": 0}
    bad: list[str] = []
    seen_ids: set[str] = set()
    started = time.perf_counter()
    try:
        with IntermediateWriter(out_path, dtype, durable) as writer:
            for batch in _batches(task, settings.on_error, bad, counts):
                offsets = np.zeros(len(batch.data) + 1, dtype=np.int64)
                np.cumsum(np.fromiter(map(len, batch.data), dtype=np.int64, count=len(batch.data)), out=offsets[1:])
                utf8 = (b"".join(batch.data), offsets)
                tokens = engine.encode_batch(batch.texts, _DocumentNames(task, batch.rows), utf8)
                _check_ids(task, batch, seen_ids)
                specials = documents_containing(*utf8, [token.encode() for token in info.special_tokens])
                writer.write_batch(batch.rows, batch.ids, batch.data, list(map(xxhash.xxh3_128_digest, batch.data)),
                                   specials, tokens)
                counts["documents"] += len(batch.data)
                counts["tokens"] += int(sum(map(len, tokens)))
                counts["text_bytes"] += int(offsets[-1])
                counts["special_token_documents"] += int(np.count_nonzero(specials))
        check_unchanged(task.source)
    except BaseException:  # a bad record, a full disk, an interrupt: leave nothing staged
        with suppress(OSError):
            out_path.unlink(missing_ok=True)
        raise
    summary: dict[str, Any] = dict(counts)
    summary["bad_record_examples"] = bad
    log = {"seconds": round(time.perf_counter() - started, 3), **engine.report()}
    assert writer.digest is not None
    return TokenizeResult(out_path, writer.digest, summary, log)

