"""Document steps applied to a tokenize batch: each configured step keeps, drops or changes each
document, in pipeline order, before the batch is tokenized; with no steps the batch is untouched."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prep.errors import InputError
from prep.stages.columns import to_strings
from prep.stages.readtask import utf8
from prep.stages.textcolumns import TextColumns
from prep.steps.protocol import DocumentStep, Drop, Outcome, StepDocument


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

    def count(self, size: int, outcome: Outcome) -> None:
        """Count one document of `size` text bytes and what the step made of it."""
        self.documents += 1
        self.text_bytes += size
        if isinstance(outcome, Drop):
            self.dropped += 1
            self.dropped_bytes += size
            self.reasons[outcome.reason] = self.reasons.get(outcome.reason, 0) + 1
            return
        self.kept += 1
        self.changed += outcome is not None

    def to_json(self) -> dict[str, object]:
        """The step's counts as a task summary records them (reasons sorted)."""
        return {"use": self.use, "documents": self.documents, "text_bytes": self.text_bytes, "kept": self.kept,
                "dropped": self.dropped, "dropped_bytes": self.dropped_bytes, "changed": self.changed,
                "reasons": dict(sorted(self.reasons.items()))}


def tallies(steps: Sequence[DocumentStep]) -> list[StepTally]:
    """Fresh counts for each step, in order."""
    return [StepTally(step.use) for step in steps]


def apply_steps(batch: TextColumns, steps: Sequence[DocumentStep], counts: Sequence[StepTally],
                where: str) -> TextColumns:
    """The batch's documents that every step keeps, with the texts the steps changed."""
    for step, tally in zip(steps, counts):
        if not len(batch):
            break
        batch = _apply_one(batch, step, tally, where)
    return batch


def _apply_one(batch: TextColumns, step: DocumentStep, tally: StepTally, where: str) -> TextColumns:
    """The documents one step keeps (changed where it changes them); the batch itself when it keeps all as they are."""
    ids = to_strings(batch.ids)
    rows: list[int] = []
    kept_ids: list[str | None] = []
    texts: list[bytes] = []
    untouched = True
    for index, (row, doc_id) in enumerate(zip(batch.rows.tolist(), ids)):
        data = batch.data(index)
        outcome = step.apply(StepDocument(doc_id, data.decode("utf-8")))
        tally.count(len(data), outcome)
        if isinstance(outcome, Drop):
            untouched = False
            continue
        if outcome is not None:
            untouched = False
            data = _encoded(doc_id, outcome, f"{where}: step {step.use!r}, row/line {row + 1}")
        rows.append(row)
        kept_ids.append(doc_id)
        texts.append(data)
    return batch if untouched else TextColumns.from_rows(rows, kept_ids, texts)


def _encoded(doc_id: str | None, text: str, where: str) -> bytes:
    """A changed text as UTF-8; InputError when a step made a text that has no UTF-8."""
    try:
        return utf8(doc_id, text)
    except ValueError as exc:
        raise InputError(f"{where}: the changed {exc}") from None
