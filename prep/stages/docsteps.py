"""Document steps applied to a tokenize batch: each configured step keeps, drops or changes each
document, in pipeline order, before the batch is tokenized; with no steps the batch is untouched."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from prep.errors import InputError
from prep.formats.jsonspelling import spell
from prep.hashing import Digest
from prep.stages.readtask import utf8
from prep.stages.specs import outcomes_path
from prep.stages.textcolumns import TextColumns
from prep.steps.protocol import Change, DocumentStep, Drop, Outcome, StepDocument
from prep.workfiles.columns import metadata_column, to_strings
from prep.workfiles.outcomes import OutcomesReplay, OutcomesWriter


@dataclass
class StepTally:
    """One step's counts over the documents it saw: in, kept, dropped, changed, and drop reasons."""

    use: str
    documents: int = 0
    text_bytes: int = 0
    kept: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    changed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def count(self, batch: TextColumns, outcomes: Sequence[Outcome]) -> None:
        """Count a batch's documents and what the step made of each (a Python step per document at most)."""
        self.documents += len(outcomes)
        self.text_bytes += len(batch.blob)
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, Drop):
                self.dropped += 1
                self.dropped_bytes += int(batch.offsets[index + 1] - batch.offsets[index])
                self.reasons[outcome.reason] = self.reasons.get(outcome.reason, 0) + 1
            elif changed_text(outcome) is not None:
                self.changed += 1
        self.kept = self.documents - self.dropped

    def to_json(self) -> dict[str, object]:
        """The step's counts as a task summary records them (reasons sorted)."""
        return {"use": self.use, "documents": self.documents, "text_bytes": self.text_bytes, "kept": self.kept,
                "dropped": self.dropped, "dropped_bytes": self.dropped_bytes, "changed": self.changed,
                "reasons": dict(sorted(self.reasons.items()))}


@dataclass
class Skipping:
    """`on_error = "skip"`: a document a step's code raised on is dropped (counted by the step as
    `raised <type>`, so not again as a bad record) and listed with the bad records, instead of
    failing the build."""

    listed: list[str]
    most: int

    def skip(self, message: str) -> None:
        """List the message of a document the step's code raised on (the first `most` of the task)."""
        if len(self.listed) < self.most:
            self.listed.append(message)


def tallies(steps: Sequence[DocumentStep]) -> list[StepTally]:
    """Fresh counts for each step, in order."""
    return [StepTally(step.name) for step in steps]


class PartSteps:
    """The document steps over one tokenize part: their counts, the outcomes of the first ones
    replayed from an earlier build, and a writer of each later one's outcomes (beside `out_path`)."""

    def __init__(self, steps: Sequence[DocumentStep], where: str, lines: Callable[[int], int],
                 skipping: Skipping | None, replays: Sequence[OutcomesReplay], out_path: Path, durable: bool) -> None:
        self.steps, self.where, self.lines, self.skipping, self.replays = steps, where, lines, skipping, replays
        self.counts = tallies(steps)
        self.writers: list[OutcomesWriter | None] = [None] * len(replays)
        try:
            for index in range(len(replays), len(steps)):
                self.writers.append(OutcomesWriter(outcomes_path(out_path, index), durable))
        except BaseException:
            self.abort()
            raise

    def apply(self, batch: TextColumns) -> TextColumns:
        """The batch's documents every step keeps, changed as the steps changed them."""
        return apply_steps(batch, self.steps, self.counts, self.where, self.skipping, self.writers, self.replays,
                           self.lines)

    def close(self) -> tuple[tuple[Path, Digest], ...]:
        """Check the replays were read to their end; finish the outcomes files of the steps that ran."""
        for replay in self.replays:
            replay.finish()
        return tuple((out.path, out.close()) for out in self.writers if out is not None)

    def abort(self) -> None:
        """Close the outcomes files without finishing them (the task failed; its caller removes them)."""
        for out in self.writers:
            if out is not None:
                with suppress(Exception):
                    out.abort()


def apply_steps(batch: TextColumns, steps: Sequence[DocumentStep], counts: Sequence[StepTally], where: str,
                skipping: Skipping | None = None, writers: Sequence[OutcomesWriter | None] = (),
                replays: Sequence[OutcomesReplay] = (), lines: Callable[[int], int] | None = None) -> TextColumns:
    """The batch's documents that every step keeps, with the texts the steps changed. The first
    `len(replays)` steps are not run: their outcomes are read back from an earlier build's files;
    what each later step drops or changes is written to its writer in `writers`, when given.
    `where` is the input file the batch was read from; `lines` gives the file's line of a row."""
    for index, (step, tally) in enumerate(zip(steps, counts)):
        if not len(batch):
            break
        outcomes: Sequence[Outcome]
        if index < len(replays):
            outcomes, notes = replays[index].take(batch.rows)
        else:
            outcomes, notes = _outcomes(batch, step, where, skipping, lines)
            writer = writers[index] if index < len(writers) else None
            if writer is not None:
                writer.add(batch.rows.tolist(), batch.ids, outcomes, batch.data, notes)
        if skipping is not None:
            for at in sorted(notes):
                skipping.skip(notes[at])
        tally.count(batch, outcomes)
        batch = _kept(batch, outcomes, step, where)
    return batch


def _outcomes(batch: TextColumns, step: DocumentStep, where: str, skipping: Skipping | None,
              lines: Callable[[int], int] | None) -> tuple[Sequence[Outcome], dict[int, str]]:
    """What one step makes of each document of the batch, and the messages of the documents its
    code raised on (skipping: they are dropped), by index."""
    try:
        whole = step.apply_batch(batch)
    except Exception as exc:  # a step's own code: named, never a traceback
        if skipping is None:
            raise InputError(f"{where}: step {step.name!r} failed on a batch of {len(batch)} documents from row/line "
                             f"{int(batch.rows[0]) + 1}: {type(exc).__name__}: {exc}") from exc
        whole = None  # skipping: ask document by document, to skip only those it fails on
    if whole is not None:
        return whole, {}
    outcomes: list[Outcome] = []
    notes: dict[int, str] = {}
    metadata = batch.metadata.to_pylist() if batch.metadata is not None else None
    for index, (doc_id, text, row) in enumerate(zip(to_strings(batch.ids), _texts(batch), batch.rows.tolist())):
        document = StepDocument(doc_id, text, where, row, json.loads(metadata[index]) if metadata else {}, lines)
        outcome, note = _decide(step, document, row, where, skipping)
        outcomes.append(outcome)
        if note is not None:
            notes[index] = note
    return outcomes, notes


def _kept(batch: TextColumns, outcomes: Sequence[Outcome], step: DocumentStep, where: str) -> TextColumns:
    """The documents a step keeps, changed where it changed them (text, metadata): the batch
    itself when it kept all as they are."""
    if all(outcome is None for outcome in outcomes):
        return batch
    if not any(isinstance(outcome, str | Change) for outcome in outcomes):
        return _without_dropped(batch, outcomes)
    ids = to_strings(batch.ids)
    rows = batch.rows.tolist()
    kept = [index for index, outcome in enumerate(outcomes) if not isinstance(outcome, Drop)]
    texts = []
    for index in kept:
        text = changed_text(outcomes[index])
        texts.append(batch.data(index) if text is None
                     else _encoded(ids[index], text, f"{where}: step {step.name!r}, row/line {rows[index] + 1}"))
    metadata = _metadata_kept(batch, [outcomes[index] for index in kept], np.asarray(kept, dtype=np.int64),
                              step, f"{where}: step {step.name!r}", [ids[index] for index in kept])
    return TextColumns.from_rows([rows[index] for index in kept], [ids[index] for index in kept], texts, metadata)


def changed_text(outcome: Outcome) -> str | None:
    """The new text an outcome gives its document; None when it keeps the text (or drops it)."""
    if isinstance(outcome, str):
        return outcome
    return outcome.text if isinstance(outcome, Change) else None


def _metadata_kept(batch: TextColumns, outcomes: Sequence[Outcome], kept: np.ndarray[Any, Any], step: DocumentStep,
                   where: str, ids: Sequence[str | None]) -> pa.Array | None:
    """The metadata of the documents `kept` (their outcomes in `outcomes`), with the keys the step
    set merged in; InputError naming the step and the document for a key it does not declare or a
    value with no JSON spelling."""
    base = batch.metadata_of(kept)
    if not any(isinstance(outcome, Change) and outcome.metadata for outcome in outcomes):
        return base
    values = base.to_pylist() if base is not None else ["{}"] * len(outcomes)
    declared = set(step.metadata_keys())
    for at, outcome in enumerate(outcomes):
        if not isinstance(outcome, Change) or not outcome.metadata:
            continue
        named = f"{where} on document {ids[at] or f'at row/line {int(batch.rows[kept[at]]) + 1}'!r}"
        unknown = sorted({key for key, _ in outcome.metadata} - declared)
        if unknown:
            raise InputError(f"{named}: sets metadata {unknown[0]!r}, which the step does not declare "
                             f"(it declares {sorted(declared)})")
        merged = {**json.loads(values[at]), **dict(outcome.metadata)}
        try:
            values[at] = spell(merged)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{named}: sets metadata JSON cannot spell ({exc})") from None
    return metadata_column([value.encode("utf-8", "surrogatepass") for value in values])


def _decide(step: DocumentStep, document: StepDocument, row: int, where: str,
            skipping: Skipping | None) -> tuple[Outcome, str | None]:
    """One document's outcome, with the message of the error it raised when skipping; InputError
    naming the step and the document when the step raises (not skipping) or answers with anything
    but None, a Drop or a str."""
    named = f"{where}: step {step.name!r} on document {document.id or f'at row/line {row + 1}'!r}"
    try:
        outcome = step.apply(document)
    except Exception as exc:  # a step's own code: named with the document, never a traceback
        if skipping is None:
            raise InputError(f"{named}: {type(exc).__name__}: {exc}") from exc
        return Drop(f"raised {type(exc).__name__}"), f"{named}: {type(exc).__name__}: {exc}"
    if outcome is not None and not isinstance(outcome, Drop | str | Change):
        raise InputError(f"{named}: answered {type(outcome).__name__}; a step returns None (keep), Drop(reason), "
                         "the new text or a Change")
    return outcome, None


def _without_dropped(batch: TextColumns, outcomes: Sequence[Outcome]) -> TextColumns:
    """The batch less the documents a step dropped, none changed."""
    return batch.masked(np.fromiter((not isinstance(outcome, Drop) for outcome in outcomes), dtype=bool,
                                    count=len(outcomes)))


def _texts(batch: TextColumns) -> Iterator[str]:
    """Each document's text: slices of one decode of an ASCII buffer, else each decoded on its own
    (slicing a wider str costs more than decoding its UTF-8)."""
    bounds = batch.offsets.tolist()
    if batch.blob.isascii():
        whole = batch.blob.decode("ascii")
        return (whole[start:end] for start, end in zip(bounds[:-1], bounds[1:]))
    view = memoryview(batch.blob)
    return (str(view[start:end], "utf-8") for start, end in zip(bounds[:-1], bounds[1:]))


def _encoded(doc_id: str | None, text: str, where: str) -> bytes:
    """A changed text as UTF-8; InputError when a step made a text that has no UTF-8."""
    try:
        return utf8(doc_id, text)
    except ValueError as exc:
        raise InputError(f"{where}: the changed {exc}") from None
