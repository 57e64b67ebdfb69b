"""The tokenize stage, fused with reading: one pass over a task's records parses, hashes and
tokenizes every document and writes one intermediate file (prep.workfiles.intermediate).

Tokenization depends only on this task's file, never on others: global dedup decisions are
applied later, when shards are assembled.
"""

from __future__ import annotations

import functools
import gc
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prep.errors import InputError
from prep.hashing import Digest
from prep.inputs.sources import check_unchanged
from prep.memory import release_free_memory, resident_bytes, trim_heap
from prep.stages.batches import read_batches
from prep.stages.docsteps import PartSteps, Skipping
from prep.stages.exclude import Excluder
from prep.stages.neardedup import batch_bands
from prep.stages.read import BadRecord, ReadTask, line_number
from prep.stages.specs import TokenizeSettings, bands_path, entries_path, staged_paths
from prep.stages.textcolumns import TextColumns
from prep.tokenizer import TokenizerInfo, load_tokenizer
from prep.tokenizer.engine import TokenizerEngine
from prep.tokenizer.spans import LazySequence, documents_containing
from prep.workfiles.bands import BandsWriter
from prep.workfiles.columns import to_strings
from prep.workfiles.entries import PART_COLUMNS, write_part_entries
from prep.workfiles.intermediate import METADATA, IntermediateWriter, io_errors
from prep.workfiles.keys import order_keys
from prep.workfiles.outcomes import OutcomesReplay

BATCH_TEXT_BYTES = 8 * 2**20
BATCH_DOCUMENTS = 65536
MAX_BAD_RECORDS_LISTED = 100
UNTRIMMED_TASKS = 4
"""Tokenize tasks a worker runs before it trims its heap between batches too (every worker trims
after each task). The local pool's workers live no longer than this once it renews them
(runner.executors.local.FRESH_AFTER), too short for the holes freed batches leave in the heap to
build up; a worker that lives on (Ray's, up to RECYCLE_AFTER tasks, or the local pool's in a build
too short to renew them) trims after every batch from then on, which bounds its peak as before. The trim's
cost is the page faults that refill the pages it gave back (docs/build.md, "Memory")."""


@dataclass(frozen=True)
class TokenizeResult:
    """A task's intermediate file, with an order seed its part's entries file, with steps the
    outcomes file of each step it ran (all local, not yet stored), and its counts."""

    path: Path
    digest: Digest
    summary: dict[str, Any]
    log: dict[str, Any] = field(default_factory=dict)
    entries: tuple[Path, Digest] | None = None
    outcomes: tuple[tuple[Path, Digest], ...] = ()  # of the steps it ran, not replayed (prep.workfiles.outcomes)
    bands: tuple[Path, Digest] | None = None  # with [dedup.near]: the part's band hashes (prep.workfiles.bands)


# gigatoken keeps a cache of every distinct pre-token it has encoded, with no bound (40M distinct
# words: 2.7 GB), so on a corpus whose vocabulary never stops growing (numbers, URLs, names,
# typos) every worker would grow without limit. So a worker that grew `settings.tokenizer_cache`
# ([build] tokenizer_cache) loads its engine afresh, the size compared like with like:
# - at the start of a task, with its size at the start of the engine's second task (both at rest,
#   the previous task's memory given back; the first task's start is too early, before the
#   worker's own one-time allocations): how real text's cache shows (16M short documents: 194 ->
#   222 MB over a worker's 40 tasks, the engine's live C heap and its table growing by that
#   much while Python's objects did not);
# - between the batches of a task, with its size once the task's first batch was encoded and the
#   heap trimmed (the batch's working set counted, its freed buffers not), so that one task of a
#   vocabulary that keeps growing cannot outgrow the bound by more than a batch.
# Dropping the engine frees its cache (and the heap is trimmed); loading costs about 0.15 s, and
# the next batch encodes with a cold cache. Tokens never depend on the cache.


@dataclass(frozen=True)
class _Loaded:
    """A worker's engine for one tokenizer, the tasks it began, and the worker's resident bytes
    when its second task began (None before): what the growth of its cache between tasks is
    measured from."""

    engine: TokenizerEngine
    info: TokenizerInfo
    tasks: int = 0  # tasks it began
    resting: int | None = None


_ENGINES: dict[tuple[object, ...], _Loaded] = {}
_RELOADS = {"count": 0}  # engines this worker loaded again because it outgrew the bound
_TASKS = {"count": 0}  # tokenize tasks this process began (a zygote's fork starts from the zygote's 0)


def _grown(since: int | None, limit: int) -> bool:
    """True when this worker is more than `limit` bytes larger than it was at `since` (None: never)."""
    if since is None:
        return False
    now = resident_bytes()
    return now is not None and now - since > limit


@dataclass
class _BatchWatch:
    """One task's check between its batches, made once a batch is done (and, in a task that trims
    between batches, the heap trimmed), when the task holds least: the first batch (or the first
    since a reload) sets the size it is compared with; a later one that outgrew it loads the engine
    afresh. A task that does not trim between batches trims before it decides, so that the holes its
    batches left never count as the tokenizer's growth."""

    settings: TokenizeSettings
    trimmed: bool
    settled: int | None = None

    def after_batch(self) -> None:
        if self.trimmed:
            trim_heap()  # costs 5-10% of a task's time; bounds its peak (docs/build.md, Memory)
        if self.settled is None:
            self.settled = resident_bytes()
            return
        if not self.trimmed and _grown(self.settled, self.settings.tokenizer_cache):
            trim_heap()
        reloads = _RELOADS["count"]
        _engine(self.settings, self.settled)
        if _RELOADS["count"] != reloads:
            self.settled = None


def _cache_key(settings: TokenizeSettings) -> tuple[object, ...]:
    return (settings.tokenizer_sha256, settings.eos, settings.encode_special_tokens, settings.backend,
            settings.threads)


def _engine(settings: TokenizeSettings, grown_since: int | None = None) -> tuple[TokenizerEngine, TokenizerInfo]:
    """One engine per worker process, keyed on the tokenizer's content hash, never its path;
    loaded again once the worker grew `settings.tokenizer_cache` past `grown_since`."""
    cache_key = _cache_key(settings)
    loaded = _ENGINES.get(cache_key)
    checked = None
    if loaded is not None and _grown(grown_since, settings.tokenizer_cache):
        checked = loaded.engine.checked  # the build log's cross-check counts go on
        loaded = None
        _drop([cache_key])
        _RELOADS["count"] += 1
    if loaded is None:
        path = Path(settings.tokenizer_path)
        tokenizer, info = load_tokenizer(path, settings.eos, settings.encode_special_tokens)
        if info.sha256 != settings.tokenizer_sha256:
            raise InputError(f"{path}: tokenizer file changed during the build, or differs on host "
                             f"{socket.gethostname()} (sha256 {info.sha256[:12]} there, {settings.tokenizer_sha256[:12]} "
                             "where the build hashed it): every node must hold the same file")
        engine = TokenizerEngine.create(settings.backend, path, tokenizer, info, settings.threads)
        if checked is not None:
            engine.checked = checked
        loaded = _ENGINES[cache_key] = _Loaded(engine, info)
        trim_heap()  # what loading parsed and freed is not the cache
    return loaded.engine, loaded.info


def _task_engine(settings: TokenizeSettings) -> TokenizerInfo:
    """The engine at the start of a task: loaded afresh when the worker, at rest, outgrew its size
    at the start of the engine's second task (recorded here: by then the worker's own first-task
    allocations are made and the commonest words cached)."""
    cache_key = _cache_key(settings)
    loaded = _ENGINES.get(cache_key)
    info = _engine(settings, loaded.resting if loaded is not None else None)[1]
    loaded = _ENGINES[cache_key]
    _ENGINES[cache_key] = replace(loaded, tasks=loaded.tasks + 1,
                                  resting=resident_bytes() if loaded.tasks == 1 else loaded.resting)
    return info


def _drop(cache_keys: list[tuple[object, ...]]) -> None:
    """Close and forget these engines, then free their caches and trim the heap."""
    for cache_key in cache_keys:
        _ENGINES.pop(cache_key).engine.backend.close()
    gc.collect()  # the engines and their caches are freed here (no caller holds one), then the heap trimmed
    release_free_memory()


def drop_engines() -> None:
    """Free this worker's tokenizer engines, for a task of a later stage: their caches of
    pre-tokens (tens of MB on real text, up to [build] tokenizer_cache) would otherwise stay resident
    under every order and shard task the worker runs. A later tokenize task loads its engine again."""
    if _ENGINES:
        _drop(list(_ENGINES))


def warm_engine(tokenizer_path: str, sha256: str, eos: str, encode_special_tokens: bool, backend: str) -> None:
    """Load this process's engine for a tokenizer file (whose SHA-256 the driver read) before its
    first task needs it. Errors are ignored: the task that needs the tokenizer reports them properly."""
    try:
        _engine(TokenizeSettings(tokenizer_path, sha256, eos, encode_special_tokens, backend, "fail"))
    except Exception:  # noqa: BLE001, S110 -- a warm-up must never fail the build
        pass


def _batches(task: ReadTask, on_error: str, bad: list[str], counts: dict[str, int]) -> Iterator[TextColumns]:
    for item in read_batches(task, counts, BATCH_DOCUMENTS, BATCH_TEXT_BYTES):
        if not isinstance(item, BadRecord):
            yield item
            continue
        if on_error == "fail":
            raise InputError(item.message(task.source.location))
        counts["bad_records"] += 1
        if len(bad) < MAX_BAD_RECORDS_LISTED:
            bad.append(item.message(task.source.rel))  # relative: summaries must not name machines


class _DocumentNames(LazySequence[str]):
    """`source:part:row` of each document of a batch, spelled only when asked (an error, a seed)."""

    def __init__(self, task: ReadTask, rows: Sequence[int] | np.ndarray[Any, Any]) -> None:
        self._prefix = f"{task.source.rel}:{task.part}:"
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def _item(self, index: int) -> str:
        return self._prefix + str(int(self._rows[index]))


class _UniqueIds:
    """Fails on an id seen before in this part, naming the first repeat's row: Arrow's hash table
    finds the part's distinct ids at its end, and only a part with a repeat is searched for it.
    Holds the ids and rows only, never a batch's text."""

    def __init__(self, task: ReadTask) -> None:
        self.task = task
        self.ids: list[pa.Array] = []
        self.rows: list[np.ndarray[Any, Any]] = []

    def add(self, batch: TextColumns) -> None:
        if batch.ids.null_count != len(batch.ids):
            self.ids.append(batch.ids)
            self.rows.append(batch.rows)

    def finish(self) -> None:
        ids = pa.chunked_array(self.ids, type=pa.string())
        if len(pc.unique(ids)) != len(ids):  # unique: a third of count_distinct's time here
            self._raise_first_repeat()

    def _raise_first_repeat(self) -> None:
        seen: set[str | None] = set()
        for batch_ids, batch_rows in zip(self.ids, self.rows):
            for row, doc_id in zip(batch_rows.tolist(), to_strings(batch_ids)):
                if doc_id in seen:
                    raise InputError(f"{self.task.source.location}: duplicate id {doc_id!r} "
                                     f"(row/line {row + 1} of this part)")
                seen.add(doc_id)


def run_tokenize(task: ReadTask, settings: TokenizeSettings, out_path: Path, durable: bool = True,
                 replays: Sequence[OutcomesReplay] = (), excluder: Excluder | None = None) -> TokenizeResult:
    """Read, hash and tokenize every document of `task` into the new local intermediate file
    `out_path` (fsynced unless `durable` is False, for a file whose store makes it durable when
    put) and, with an order seed, write the part's entries (prep.workfiles.entries) beside it.
    The first `len(replays)` steps are replayed from an earlier build's outcomes, not run; each
    later step's outcomes are written beside `out_path`. With an `excluder` (a deletion request),
    the documents it names are dropped before the steps: no file of the task holds them."""
    reloads_before = _RELOADS["count"]
    info = _task_engine(settings)  # holding no reference to the engine: a reload must free the old one
    dtype = np.dtype(info.dtype)
    counts = {"documents": 0, "tokens": 0, "text_bytes": 0, "bad_records": 0, "special_token_documents": 0,
              "lines": 0}
    bad: list[str] = []
    unique_ids = _UniqueIds(task)
    special_needles = [token.encode() for token in info.special_tokens]
    started = time.perf_counter()
    watch = _BatchWatch(settings, trimmed=_TASKS["count"] >= UNTRIMMED_TASKS)
    _TASKS["count"] += 1
    skipping = Skipping(bad, MAX_BAD_RECORDS_LISTED) if settings.on_error == "skip" else None
    steps = PartSteps(settings.steps, task.source.rel, functools.partial(line_number, task), skipping, replays,
                      out_path, durable) if settings.steps else None
    bands = _bands_writer(out_path, settings)
    try:
        with IntermediateWriter(out_path, dtype, durable, settings.order_seed, bool(settings.metadata_keys)) as writer:
            for batch in _batches(task, settings.on_error, bad, counts):
                unique_ids.add(batch)  # a document a step drops was read: its id counts
                if excluder is not None:
                    batch = excluder.apply(batch)
                if settings.metadata_keys and batch.metadata is None:  # keys only steps set: each starts empty
                    batch = batch.with_empty_metadata()
                if steps is not None:
                    batch = steps.apply(batch)
                if len(batch):
                    _write_batch(batch, task, settings, writer, special_needles, counts, bands)
                watch.after_batch()
            unique_ids.finish()
        outcomes = steps.close() if steps is not None else ()
        check_unchanged(task.source)
        entries = None
        if settings.order_seed is not None:
            staged = entries_path(out_path)
            entries = (staged, _write_entries(staged, writer, settings.order_seed))
        banded = (bands.path, bands.close()) if bands is not None else None
    except BaseException:  # a bad record, a full disk, an interrupt: leave nothing staged
        if steps is not None:
            steps.abort()
        for path in staged_paths(out_path, len(settings.steps)):
            with suppress(OSError):
                path.unlink(missing_ok=True)
        raise
    summary = _summary(counts, bad, steps, excluder)
    log = {"seconds": round(time.perf_counter() - started, 3), **_engine(settings)[0].report(),
           "engine_reloads": _RELOADS["count"] - reloads_before}
    assert writer.digest is not None
    return TokenizeResult(out_path, writer.digest, summary, log, entries, outcomes, banded)


def _summary(counts: dict[str, int], bad: list[str], steps: PartSteps | None,
             excluder: Excluder | None) -> dict[str, Any]:
    """What the task counted, as its record's summary: documents and tokens written, bad records,
    and with steps each one's counts, with a deletion request the documents it excluded."""
    summary: dict[str, Any] = {**counts, "bad_record_examples": bad}
    if excluder is not None:
        summary["excluded"] = excluder.excluded
    if steps is not None:
        summary["steps"] = [tally.to_json() for tally in steps.counts]
    return summary


def _write_batch(batch: TextColumns, task: ReadTask, settings: TokenizeSettings, writer: IntermediateWriter,
                 special_needles: list[bytes], counts: dict[str, int], bands: BandsWriter | None) -> None:
    """Encode one batch and write it to the task's intermediate (and its band hashes to `bands`);
    its buffers are freed on return."""
    # The engine is looked up afresh for each batch (a reload must free the old one), never held.
    tokens, token_offsets = _engine(settings)[0].encode_columns(batch.blob, batch.offsets,
                                                                _DocumentNames(task, batch.rows))
    specials = documents_containing(batch.blob, batch.offsets, special_needles)
    text_hashes = batch.text_hashes()
    writer.write_columns(batch.rows, batch.ids, batch.blob, batch.offsets, text_hashes, specials,
                         tokens, token_offsets, batch.metadata)
    if bands is not None:
        _add_bands(bands, batch, text_hashes, settings)
    counts["documents"] += len(batch)
    counts["tokens"] += int(token_offsets[-1])
    counts["text_bytes"] += len(batch.blob)
    counts["special_token_documents"] += int(np.count_nonzero(specials))


def _bands_writer(out_path: Path, settings: TokenizeSettings) -> BandsWriter | None:
    """With [dedup.near] (which needs the order seed: bands name each document's order bucket), the
    writer of the part's band hashes beside its intermediate."""
    if settings.near is None:
        return None
    if settings.order_seed is None:
        raise ValueError("near-duplicate bands need an order seed")
    return BandsWriter(bands_path(out_path), settings.near.bands)


def _add_bands(bands: BandsWriter, batch: TextColumns, text_hashes: bytes, settings: TokenizeSettings) -> None:
    """A batch's band hashes, with each document's row and order key high word."""
    assert settings.near is not None and settings.order_seed is not None
    pairs = np.frombuffer(text_hashes, dtype="<u8", count=2 * len(batch)).reshape(-1, 2)
    key_hi, _ = order_keys(pairs, settings.order_seed)
    bands.add(np.asarray(batch.rows), key_hi, batch_bands(batch.blob, batch.offsets, settings.near))


def _write_entries(path: Path, writer: IntermediateWriter, seed: int) -> Digest:
    """The part's entries, from the metadata the writer holds: no second read of the part."""
    with io_errors("writing", path):
        table = writer.metadata()
        columns = [*PART_COLUMNS, *([METADATA] if METADATA in table.schema.names else [])]
        return write_part_entries(path, table.select(columns), seed, writer.key_runs())

