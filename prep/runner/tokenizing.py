"""The tokenize stage: one task per input part reads its records, runs the document steps,
tokenizes what they keep and stores the part's intermediate and entries; its result lists every
part, in input order, with what its task counted."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prep.errors import IntegrityError, NotFoundError, StorageIOError
from prep.faults import crash_point
from prep.inputs.sources import SourceFile
from prep.progress import human_bytes, plural
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, stored_table, worker_store
from prep.stages.read import ReadTask, plan_read_tasks
from prep.stages.specs import TokenizeSettings, staged_paths
from prep.steps import catalog
from prep.storage.backend import Store
from prep.store import cas
from prep.store.layout import task_record_key
from prep.store.records import TaskRecord

if TYPE_CHECKING:
    from prep.workfiles.outcomes import OutcomesReplay


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
    outcome_keys: tuple[str, ...] = ()  # each step's outcomes key over this part (Tokenizing.outcome_keys)
    replay: tuple[str, ...] = ()  # the outcomes objects of the first steps, committed by an earlier build

    def input_bytes(self) -> int:
        """Input bytes the task covers, for rates (a Parquet file counts once, at part 0, since
        its task ranges count row groups, not bytes)."""
        if self.task.source.format == "parquet":
            return self.task.source.size if self.task.part == 0 else 0
        return self.task.end - self.task.start


def run_tokenize_job(job: TokenizeJob) -> TaskResult:
    from prep.stages.exclude import Excluder
    from prep.stages.tokenize import run_tokenize

    store = worker_store(job.store_url)
    replays = _replays(store, job)
    exclude = job.settings.exclude
    result = run_tokenize(job.task, job.settings, store.staging_dir() / job.staged_name,
                         durable=not job.driver_stores, replays=replays,
                         excluder=Excluder(stored_table(store, exclude)) if exclude is not None else None)
    files = {"intermediate": (result.path, result.digest)}
    if result.entries is not None:
        files["entries"] = result.entries
    if result.bands is not None:
        files["bands"] = result.bands
    ran = range(len(replays), len(job.settings.steps))
    files.update({_step_output(index): outcome for index, outcome in zip(ran, result.outcomes)})
    replayed = {_step_output(index): job.replay[index] for index in range(len(replays))}
    aliases = tuple(("steps", job.outcome_keys[index], (("outcomes", _step_output(index)),)) for index in ran)
    if job.driver_stores:
        crash_point("tokenize.after_output")
        staged = {name: (str(path), digest.sha256, digest.size) for name, (path, digest) in files.items()}
        return TaskResult(replayed, result.summary, result.log, staged, aliases=aliases)
    try:
        outputs = {name: cas.put_file(store, path, digest).id for name, (path, digest) in files.items()}
    finally:
        for path, _ in files.values():
            path.unlink(missing_ok=True)
    crash_point("tokenize.after_output")
    return TaskResult({**outputs, **replayed}, result.summary, result.log, aliases=aliases)


def _step_output(step: int) -> str:
    """The name a tokenize task record gives the outcomes object of its part's step `step`."""
    return f"step.{step}"


def _replays(store: Store, job: TokenizeJob) -> list[OutcomesReplay]:
    """The committed outcomes of the job's first steps, read and checked; a missing or corrupt one
    ends the list there (its step and those after it run again: they are a cache, never needed)."""
    from prep.workfiles.outcomes import OutcomesReplay

    replays = []
    for index, object_id in enumerate(job.replay):
        try:
            replays.append(OutcomesReplay(cas.get_bytes(store, object_id),
                                          f"{job.store_url}: outcomes {object_id} of step {index + 1}"))
        except (IntegrityError, NotFoundError, StorageIOError):
            break
    return replays


def discard_staged(job: TokenizeJob) -> None:
    """Remove what a job that will never be committed left in the store's staging folder."""
    if job.driver_stores:
        staged = worker_store(job.store_url).staging_dir() / job.staged_name
        for path in staged_paths(staged, len(job.settings.steps)):
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
    outcomes: tuple[str, ...]  # with [[steps]]: each step's outcomes object over the part (prep.workfiles.outcomes)
    documents: int
    tokens: int
    text_bytes: int
    bad_records: int
    special_token_documents: int
    lines: int
    bad_record_examples: tuple[str, ...]
    steps: tuple[StepCounts, ...] | None
    bands: str | None = None  # with [dedup.near]: the part's bands object (prep.workfiles.bands)
    excluded: int | None = None  # with [input] exclude: the documents a deletion request dropped

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "source": self.source, "sha256": self.sha256, "format": self.format, "part": self.part,
            "start": self.start, "end": self.end, "key": self.key, "output": self.output, "entries": self.entries,
            "line_offset": self.line_offset, **({"step_outcomes": list(self.outcomes)} if self.outcomes else {}),
            "documents": self.documents, "tokens": self.tokens,
            "text_bytes": self.text_bytes, "bad_records": self.bad_records,
            "special_token_documents": self.special_token_documents, "lines": self.lines,
            "bad_record_examples": list(self.bad_record_examples), **({"bands": self.bands} if self.bands else {}),
            **({"excluded": self.excluded} if self.excluded is not None else {})}
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
                   _part_outcomes(record, 0 if steps is None else len(steps)), int(summary["documents"]),
                   int(summary["tokens"]), int(summary["text_bytes"]),
                   int(summary["bad_records"]), int(summary["special_token_documents"]), int(summary["lines"]),
                   tuple(str(line) for line in summary["bad_record_examples"]),
                   None if steps is None else tuple(StepCounts.from_json(counts) for counts in steps),
                   record.outputs.get("bands"), _excluded(summary))


def _excluded(summary: Mapping[str, Any]) -> int | None:
    """The documents a deletion request dropped from the part, None for a build without one."""
    value = summary.get("excluded")
    return None if value is None else int(value)


def _part_outcomes(record: TaskRecord, steps: int) -> tuple[str, ...]:
    """The outcomes object of each of the part's steps, in step order; IntegrityError for a record
    that lacks one (no rerun replaces a committed record)."""
    names = [_step_output(index) for index in range(steps)]
    if any(name not in record.outputs for name in names):
        raise IntegrityError(f"task record tokenize/{record.key} names no outcomes of some of its {steps} steps; "
                             "remove it and rebuild")
    return tuple(record.outputs[name] for name in names)


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
    exclusion_table: bytes | None = None  # [input] exclude: stored once, named by settings.exclude

    def read_tasks(self) -> list[ReadTask]:
        """Every input part, in input order."""
        return [task for source in self.sources
                for task in plan_read_tasks(source, self.text_field, self.id_field, self.max_document_bytes,
                                            self.metadata_fields)]

    def plan(self, previous: None, context: StageContext) -> StagePlan:
        reads = self.read_tasks()
        keys = [context.task_key("tokenize", self.settings.key_fields(), *read.key_parts()) for read in reads]
        found = context.committed("tokenize", keys)
        outcome_keys = {key: self.outcome_keys(read, context) for key, read in zip(keys, reads)}
        replay = _committed_outcomes(context, {key: outcome_keys[key] for key in keys if found.get(key) is None})
        tasks = []
        for key, read in zip(keys, reads):
            job = TokenizeJob(context.store_url, read, self.settings, context.driver_stores,
                              outcome_keys=outcome_keys[key], replay=replay.get(key, ()))
            tasks.append(Task(key, job, f"tokenize output of {read.source.rel} part {read.part}",
                              job.input_bytes(), job.input_bytes()))
        total = sum(source.size for source in self.sources)
        return StagePlan(TaskPlan("tokenize", tuple(tasks), run_tokenize_job, found=found, discard=discard_staged,
                                  tables=self._tables(context)),
                         self.settings.key_fields(), [task.key for task in tasks],
                         f"{plural(len(tasks), 'task')} over {plural(len(self.sources), 'file')}, {human_bytes(total)}")

    def _tables(self, context: StageContext) -> dict[str, bytes]:
        """The exclusion table the tasks read by id, checked to be the one their settings name."""
        if self.exclusion_table is None:
            return {}
        table_id = context.table_id(self.exclusion_table)
        if table_id != self.settings.exclude:
            raise ValueError(f"the exclusion table is {table_id}, the tokenize settings name {self.settings.exclude}")
        return {table_id: self.exclusion_table}

    def outcome_keys(self, read: ReadTask, context: StageContext) -> tuple[str, ...]:
        """The key of each step's outcomes over a part: what the step and every step before it
        are (kind, code, settings), how the part is read, what a raising step does and the exclusion
        table (the documents it drops reach no step). A step's
        outcomes depend on nothing else, so a build that changes a step (or adds one after the
        others) replays those before it from an earlier build's outcomes instead of running them."""
        steps = catalog.key_fields(self.settings.steps)
        exclude = {"exclude": self.settings.exclude} if self.settings.exclude is not None else {}
        return tuple(context.task_key("steps", {"steps": steps[:count], "on_error": self.settings.on_error, **exclude},
                                      *read.key_parts()) for count in range(1, len(steps) + 1))

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


def _committed_outcomes(context: StageContext, keys: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """For each task to run (by key), the outcomes objects an earlier build committed for its first
    steps, as far as they go unbroken: one lookup a task for its first step, one more for each
    step found (a first build pays one lookup a task)."""
    replay: dict[str, tuple[str, ...]] = {key: () for key in keys}
    pending = [key for key, steps in keys.items() if steps]
    for level in range(max((len(steps) for steps in keys.values()), default=0)):
        found = context.committed("steps", [keys[key][level] for key in pending])
        reached = []
        for key in pending:
            record = found.get(keys[key][level])
            if record is not None and "outcomes" in record.outputs:
                replay[key] += (record.outputs["outcomes"],)
                if level + 1 < len(keys[key]):
                    reached.append(key)
        pending = reached
        if not pending:
            break
    return replay


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0
