"""Documents the document steps dropped: finding one by its name (`prep trace`), listing what
one step dropped (`prep show --dropped`) and saying why a document is missing from a snapshot
(`prep diff --documents`), from each part's step outcomes files."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prep.errors import UsageError
from prep.history.documents import stage_manifest, verified_object
from prep.storage.backend import Store
from prep.store.layout import is_decimal
from prep.store.snapshots import Snapshot
from prep.workfiles.docnames import document_id, record_line
from prep.workfiles.outcomes import read_outcomes


@dataclass(frozen=True)
class DroppedDocument:
    """One document a step dropped: its name, where it was read, which step dropped it and why,
    and its text when the part kept it (the first few each step dropped)."""

    id: str
    source: str
    line: int
    step: int
    use: str
    reason: str
    detail: str | None
    text: str | None

    def to_json(self) -> dict[str, Any]:
        """The document as reports print it (manifests/trace-report-1.schema.json, `$defs/dropped`)."""
        return {"id": self.id, "source": self.source, "line": self.line,
                "dropped_by": {"step": self.step, "use": self.use, "reason": self.reason,
                               **({"detail": self.detail} if self.detail else {})}}


def step_uses(snapshot: Snapshot) -> list[str]:
    """The `use` of each of the snapshot's `[[steps]]`, in order (none: [])."""
    return [str(entry.get("use", "?")) for entry in snapshot.manifest.get("config", {}).get("steps", [])]


def dropped_documents(store: Store, snapshot: Snapshot, source: str | None = None,
                      step: int | None = None) -> Iterator[DroppedDocument]:
    """Every document a step dropped (of input file `source` only, and by step number `step`
    (0-based) only, when given), in input order (none when the snapshot has no steps; snapshots
    built before step outcomes were recorded per step list none either)."""
    uses = step_uses(snapshot)
    for task in stage_manifest(store, snapshot, "tokenize")["tasks"] if uses else ():
        if source is not None and task["source"] != source:
            continue
        outcomes = list(enumerate(task.get("step_outcomes", ())))
        steps = [_step_drops(store, task, index, object_id, uses) for index, object_id in outcomes
                 if step is None or index == step]
        yield from heapq.merge(*steps, key=lambda document: document.line)


def _step_drops(store: Store, task: dict[str, Any], step: int, object_id: str,
                uses: list[str]) -> Iterator[DroppedDocument]:
    """The documents one step dropped from one part, in input order."""
    path = verified_object(store, object_id, f"the outcomes of step {step + 1} over {task['source']}")
    for batch in read_outcomes(path):
        for row in batch.to_pylist():
            if row["reason"] is None:  # changed, not dropped
                continue
            line = record_line(task["format"], int(task["line_offset"]), int(row["row"]))
            yield DroppedDocument(document_id(row["id"], task["source"], line), task["source"], line, step,
                                  uses[step] if step < len(uses) else "?", row["reason"], row["detail"], row["text"])


def find_dropped(store: Store, snapshot: Snapshot, spec: str) -> list[DroppedDocument]:
    """The dropped documents `spec` names: an id, SOURCE:ID or SOURCE:LINE."""
    def named(document: DroppedDocument) -> bool:
        if document.id == spec:
            return True
        source, _, rest = spec.rpartition(":")
        return source == document.source and (rest == document.id or is_decimal(rest) and int(rest) == document.line)
    return [document for document in dropped_documents(store, snapshot) if named(document)]


def dropped_by(store: Store, snapshot: Snapshot, step: str, limit: int) -> list[DroppedDocument]:
    """The first `limit` documents step `step` (its 1-based number or its `use`) dropped."""
    uses = step_uses(snapshot)
    if not uses:
        raise UsageError(f"snapshot {snapshot.id[:19]} was built with no [[steps]]: no step dropped anything")
    if is_decimal(step) and 1 <= int(step) <= len(uses):
        index = int(step) - 1
    elif uses.count(step) == 1:
        index = uses.index(step)
    else:
        listed = ", ".join(f"{number} ({use})" for number, use in enumerate(uses, start=1))
        reason = "names several steps" if uses.count(step) > 1 else "names no step"
        raise UsageError(f"--dropped {step!r} {reason} of snapshot {snapshot.id[:19]}: use one of {listed}")
    return list(itertools.islice(dropped_documents(store, snapshot, step=index), limit))


class DropLookup:
    """Why a snapshot lacks a document of one of its input files: the step that dropped it, if
    one did. Changes come file by file, so one file's dropped documents are held at a time."""

    def __init__(self, store: Store, snapshot: Snapshot) -> None:
        self.store, self.snapshot = store, snapshot
        self._source: str | None = None
        self._why: dict[str, str] = {}

    def why(self, source: str, doc_id: str) -> str | None:
        """`dropped by step N (use): reason` for document `doc_id` of `source`, else None."""
        if source != self._source:
            self._source = source
            self._why = {document.id: f"dropped by step {document.step + 1} ({document.use}): {document.reason}"
                         for document in dropped_documents(self.store, self.snapshot, source)}
        return self._why.get(doc_id)
