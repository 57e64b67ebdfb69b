"""The tokenize stage: one task per input part reads its records, runs the document steps,
tokenizes what they keep and stores the part's intermediate and entries; its result lists every
part, in input order, with what its task counted."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prep.errors import IntegrityError
from prep.faults import crash_point
from prep.inputs.sources import SourceFile
from prep.progress import human_bytes, plural
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, worker_store
from prep.stages.read import ReadTask, plan_read_tasks
from prep.stages.specs import TokenizeSettings, dropped_path, entries_path
from prep.store import cas
from prep.store.layout import task_record_key
from prep.store.records import TaskRecord


@dataclass(frozen=True)
class TokenizeJob:
    """Tokenize one read task. With `driver_stores`, the intermediate is left in the store's
    staging folder for the driver to store: the fsync that makes it durable then waits in the
    driver, not in a worker that could be tokenizing the next task."""

    store_url: str
    task: ReadTask
    settings: TokenizeSettings
    driver_stores: bool = False
    staged_name: str = field(default_factory=lambda: f"tokenize-{uuid.uuid4().hex}.part")

    def input_bytes(self) -> int:
        """Input bytes the task covers, for rates (a Parquet file counts once, at part 0, since
        its task ranges count row groups, not bytes)."""
        if self.task.source.format == "parquet":
            return self.task.source.size if self.task.part == 0 else 0
        return self.task.end - self.task.start


def run_tokenize_job(job: TokenizeJob) -> TaskResult:
    from prep.stages.tokenize import run_tokenize

    store = worker_store(job.store_url)
    result = run_tokenize(job.task, job.settings, store.staging_dir() / job.staged_name, durable=not job.driver_stores)
    files = {"intermediate": (result.path, result.digest)}
    if result.entries is not None:
        files["entries"] = result.entries
    if result.dropped is not None:
        files["dropped"] = result.dropped
    if job.driver_stores:
        crash_point("tokenize.after_output")
        staged = {name: (str(path), digest.sha256, digest.size) for name, (path, digest) in files.items()}
        return TaskResult({}, result.summary, result.log, staged)
    try:
        outputs = {name: cas.put_file(store, path, digest).id for name, (path, digest) in files.items()}
    finally:
        for path, _ in files.values():
            path.unlink(missing_ok=True)
    crash_point("tokenize.after_output")
    return TaskResult(outputs, result.summary, result.log)


def discard_staged(job: TokenizeJob) -> None:
    """Remove what a job that will never be committed left in the store's staging folder."""
    if job.driver_stores:
        staged = worker_store(job.store_url).staging_dir() / job.staged_name
        for path in (staged, entries_path(staged), dropped_path(staged)):
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class StepCounts:
    """One document step's counts over a part (or a corpus): documents seen, kept, dropped, changed."""

    use: str
    documents: int
    text_bytes: int
    kept: int
    dropped: int
    dropped_bytes: int
    changed: int
    reasons: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, object]:
        return {"use": self.use, "documents": self.documents, "text_bytes": self.text_bytes, "kept": self.kept,
                "dropped": self.dropped, "dropped_bytes": self.dropped_bytes, "changed": self.changed,
                "reasons": dict(self.reasons)}

    def __add__(self, other: StepCounts) -> StepCounts:
        """The counts of one step over two parts (the kind is this one's)."""
        reasons = dict(self.reasons)
        for reason, count in other.reasons:
            reasons[reason] = reasons.get(reason, 0) + count
        return StepCounts(self.use, self.documents + other.documents, self.text_bytes + other.text_bytes,
                          self.kept + other.kept, self.dropped + other.dropped,
                          self.dropped_bytes + other.dropped_bytes, self.changed + other.changed,
                          tuple(sorted(reasons.items())))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepCounts:
        return cls(str(data["use"]), int(data["documents"]), int(data["text_bytes"]), int(data["kept"]),
                   int(data["dropped"]), int(data["dropped_bytes"]), int(data["changed"]),
                   tuple(sorted((str(reason), int(count)) for reason, count in data["reasons"].items())))


@dataclass(frozen=True)
class TokenizedPart:
    """One committed tokenize task as its stage manifest lists it: the part of which input, its
    key and objects, where its lines start in the file, and what its task counted."""

    source: str
    sha256: str
    format: str
    part: int
    start: int
    end: int
    key: str
    output: str
    entries: str
    line_offset: int
    dropped: str | None  # with [[steps]]: the part's dropped-documents object (prep.workfiles.dropped)
    documents: int
    tokens: int
    text_bytes: int
    bad_records: int
    special_token_documents: int
    lines: int
    bad_record_examples: tuple[str, ...]
    steps: tuple[StepCounts, ...] | None

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "source": self.source, "sha256": self.sha256, "format": self.format, "part": self.part,
            "start": self.start, "end": self.end, "key": self.key, "output": self.output, "entries": self.entries,
            "line_offset": self.line_offset, **({"dropped": self.dropped} if self.dropped else {}),
            "documents": self.documents, "tokens": self.tokens,
            "text_bytes": self.text_bytes, "bad_records": self.bad_records,
            "special_token_documents": self.special_token_documents, "lines": self.lines,
            "bad_record_examples": list(self.bad_record_examples)}
        if self.steps is not None:
            data["steps"] = [counts.to_json() for counts in self.steps]
        return data

    @classmethod
    def of(cls, task: ReadTask, key: str, record: TaskRecord, line_offset: int, store_url: str) -> TokenizedPart:
        """The part a committed task record describes."""
        summary = record.summary
        steps = summary.get("steps")
        return cls(task.source.rel, task.source.sha256, task.source.format, task.part, task.start, task.end, key,
                   record.outputs["intermediate"], _part_entries(store_url, record), line_offset,
                   record.outputs.get("dropped"), int(summary["documents"]), int(summary["tokens"]), int(summary["text_bytes"]),
                   int(summary["bad_records"]), int(summary["special_token_documents"]), int(summary["lines"]),
                   tuple(str(line) for line in summary["bad_record_examples"]),
                   None if steps is None else tuple(StepCounts.from_json(counts) for counts in steps))


def _part_entries(store_url: str, record: TaskRecord) -> str:
    """The part's entries object a tokenize task record names; IntegrityError for a record without
    one (valid for a build before layout 3, never under a key of this code), which no rerun replaces."""
    if "entries" not in record.outputs:
        raise IntegrityError(f"{store_url}/{task_record_key('tokenize', record.key)}: the task record names no "
                             "part's entries (a record of an earlier layout under this build's key); remove it and "
                             "rebuild")
    return record.outputs["entries"]


@dataclass(frozen=True)
class Tokenized:
    """The tokenize stage's result: every part in input order."""

    parts: tuple[TokenizedPart, ...]

    def manifest(self) -> dict[str, object]:
        return {"tasks": [part.to_json() for part in self.parts]}

    @property
    def documents(self) -> int:
        return sum(part.documents for part in self.parts)


@dataclass(frozen=True)
class Tokenizing:
    """The tokenize stage over the hashed input files, with the pipeline's read settings."""

    sources: tuple[SourceFile, ...]
    settings: TokenizeSettings
    text_field: str
    id_field: str | None
    max_document_bytes: int
    metadata_fields: tuple[str, ...] = ()
    name: str = "tokenize"

    def read_tasks(self) -> list[ReadTask]:
        """Every input part, in input order."""
        return [task for source in self.sources
                for task in plan_read_tasks(source, self.text_field, self.id_field, self.max_document_bytes,
                                            self.metadata_fields)]

    def plan(self, previous: None, context: StageContext) -> StagePlan:
        tasks = []
        for read in self.read_tasks():
            job = TokenizeJob(context.store_url, read, self.settings, context.driver_stores)
            key = context.task_key("tokenize", self.settings.key_fields(), *read.key_parts())
            tasks.append(Task(key, job, f"tokenize output of {read.source.rel} part {read.part}",
                              job.input_bytes(), job.input_bytes()))
        total = sum(source.size for source in self.sources)
        return StagePlan(TaskPlan("tokenize", tuple(tasks), run_tokenize_job, discard=discard_staged),
                         self.settings.key_fields(), [task.key for task in tasks],
                         f"{plural(len(tasks), 'task')} over {plural(len(self.sources), 'file')}, {human_bytes(total)}")

    def result(self, previous: None, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Tokenized:
        parts = []
        line_offsets: dict[str, int] = {}
        for task in plan.tasks.tasks:
            job: TokenizeJob = task.job
            offset = line_offsets.get(job.task.source.rel, 0)
            part = TokenizedPart.of(job.task, task.key, committed[task.key], offset, job.store_url)
            line_offsets[job.task.source.rel] = offset + part.lines
            parts.append(part)
        return Tokenized(tuple(parts))

    def done(self, result: Tokenized, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        reloads = sum(_count(log.get("engine_reloads", 0)) for log in logs)
        return stage_counts(run) + (f", tokenizer reloaded {plural(reloads, 'time')} ([build] tokenizer_cache)"
                                    if reloads else "")


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0
