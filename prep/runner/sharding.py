"""The shard stage: the order stage's leaves cut into content-defined shards, each written once
per output format unit by tasks keyed by the shard's content digest, so an unchanged shard is
never written again; units are grouped into a few jobs per worker, heaviest first."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prep.errors import IntegrityError
from prep.faults import crash_point
from prep.formats.registry import output_format
from prep.formats.units import units_for
from prep.progress import plural
from prep.quality.sourcemix import SourceMix
from prep.runner.ordering import Ordered
from prep.runner.planning import contiguous_ranges
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan
from prep.runner.tasks import BatchResult, TaskResult, stored_table, worker_store
from prep.stages.cuts import plan_shards
from prep.stages.specs import ShardParts, TokenizeSettings
from prep.store import cas
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord
from prep.workfiles.shardplan import ShardPlan

SHARD_JOBS_PER_WORKER = 4
"""Shard units are grouped into this many jobs per worker (a job carries the parts table, so not
one per unit), handed out largest first: one slow job no longer leaves the other workers idle for
the rest of the stage, as one job per worker did (16M documents: 5.0 s against 3.2 s)."""


@dataclass(frozen=True)
class Unit:
    """One unit of one shard (a format unit: "bin" writes .bin and .idx) and its task key."""

    plan: ShardPlan
    unit: str
    key: str


@dataclass(frozen=True)
class AssembleJob:
    """Write some units of some shards (see prep.stages.shard) and store their files.
    `buckets` names the bucket object of every bucket the shards' slices read; `parts_table` is
    the object id of the ShardParts of every part's intermediate, source and line offset (stored
    once by the runner); `read_back` False (a build run with
    `--no-readback`) writes the files without reading them back from the disk."""

    store_url: str
    parts_table: str
    buckets: tuple[tuple[int, str], ...]
    units: tuple[Unit, ...]
    dtype: str
    eos_id: int
    read_back: bool = True
    metadata_keys: tuple[str, ...] = ()  # the build's metadata keys (TokenizeSettings.metadata_keys)


def run_assemble_job(job: AssembleJob) -> BatchResult:
    """One result per unit, by the unit's task key: its files by format and their sizes."""
    import numpy as np

    from prep.quality.sourcemix import SourceTally
    from prep.stages.members import PartNames
    from prep.stages.shard import PartReader, collect_shard, write_unit
    from prep.stages.tokenize import drop_engines

    drop_engines()
    store = worker_store(job.store_url)
    parts = ShardParts.from_bytes(stored_table(store, job.parts_table))
    names = PartNames.of(parts)
    reader = PartReader([fetch_local(store, object_id) for object_id in parts.object_ids()])
    buckets = {bucket: fetch_local(store, object_id) for bucket, object_id in job.buckets}
    work_dir = store.staging_dir() / f"assemble-{uuid.uuid4().hex}"
    work_dir.mkdir(parents=True)
    results: list[tuple[str, TaskResult]] = []
    try:
        for unit in job.units:
            spec = output_format(unit.unit)
            tally = SourceTally(names.source_of, len(names.sources))
            documents = collect_shard(unit.plan, buckets, names, spec.needs_json, spec.needs_ids, job.metadata_keys,
                                      tally)
            written = write_unit(unit.unit, unit.plan, documents, reader, np.dtype(job.dtype), job.eos_id, work_dir,
                                 job.read_back)
            try:
                sources = tally.mix(unit.plan.documents, unit.plan.name).to_json()
            except ValueError as exc:
                raise IntegrityError(str(exc)) from None
            crash_point("shard.after_write")
            outputs: dict[str, str] = {}
            sizes: dict[str, int] = {}
            read_back: list[tuple[str, cas.FileStamp]] = []
            for fmt, file in sorted(written.items()):
                cas.put_file(store, file.path, file.digest)
                crash_point("shard.between_puts")
                outputs[fmt], sizes[fmt] = file.digest.id, file.digest.size
                staged = os.stat(file.path) if file.read_back else None
                file.path.unlink()
                stamp = cas.file_stamp(store, file.digest.id) if staged else None
                if staged is not None and stamp is not None and stamp.same_file(staged):  # stored as this very file
                    read_back.append((file.digest.id, stamp))
            results.append((unit.key, TaskResult(outputs, {"sizes": sizes, "sources": sources}, {},
                                                 read_back=tuple(read_back))))
        return BatchResult(tuple(results))
    finally:
        reader.close()
        shutil.rmtree(work_dir, ignore_errors=True)


@dataclass(frozen=True)
class ShardOut:
    """A written shard as the shard stage manifest lists it: its plan, its files and their sizes,
    and the mix of input files its documents come from."""

    plan: ShardPlan
    outputs: tuple[tuple[str, str], ...]
    sizes: tuple[tuple[str, int], ...]
    sources: SourceMix

    def to_json(self) -> dict[str, object]:
        return {**self.plan.to_json(), "outputs": dict(self.outputs), "sizes": dict(self.sizes),
                "sources": self.sources.to_json()}


@dataclass(frozen=True)
class Sharded:
    """The shard stage's result: every shard in key order, with what it was cut from."""

    shards: tuple[ShardOut, ...]
    ordered: Ordered
    parts_table: str  # the ShardParts object every shard job read

    def manifest(self) -> dict[str, object]:
        return {"shards": [shard.to_json() for shard in self.shards], "parts_table": self.parts_table}


@dataclass(frozen=True)
class Sharding:
    """The shard stage: every shard of at most `shard_size` bytes, in each unit of `formats`."""

    formats: tuple[str, ...]
    shard_size: int
    dtype: str
    eos_id: int
    tokenize: TokenizeSettings
    name: str = "shard"

    def settings(self) -> dict[str, object]:
        """What a unit's bytes follow from besides its digest (keys stand for texts)."""
        return {"dtype": self.dtype, "eos_id": self.eos_id, "tokenize": self.tokenize.key_fields()}

    def stage_settings(self) -> dict[str, object]:
        """What the stage key names besides the order stage's output: the settings and the formats."""
        return {**self.settings(), "formats": list(self.formats)}

    def plan(self, previous: Ordered, context: StageContext) -> StagePlan:
        plans = plan_shards([bucket.to_json() for bucket in previous.buckets], previous.bits, self.shard_size)
        units = [Unit(plan, unit, context.task_key("shard", self.settings(), unit, plan.name, plan.depth, plan.digest))
                 for plan in plans for unit in units_for(self.formats)]
        found = context.committed("shard", [unit.key for unit in units])
        parts = previous.tokenized.parts
        table = ShardParts.of([(part.output, part.source, part.line_offset) for part in parts]).to_bytes()
        buckets = {bucket.bucket: bucket.output for bucket in previous.buckets}
        part_ids = tuple(part.output for part in parts)
        tasks = tuple(Task(unit.key, unit, f"shard {unit.plan.name} {unit.unit} file", unit_weight(unit.plan, unit.unit),
                           unit_weight(unit.plan, unit.unit)) for unit in units)
        batching = Batching(context.store_url, context.table_id(table), buckets, self.dtype, self.eos_id, context.read_back,
                            self.tokenize.metadata_keys)
        committed = sum(record is not None for record in found.values())
        return StagePlan(TaskPlan("shard", tasks, run_assemble_job, found=found, final=True,
                                  reads=lambda missing: _reads(missing, part_ids, buckets), batch=batching.jobs,
                                  tables={batching.parts_table: table}),
                         self.stage_settings(), [context.stage_output("order")],
                         f"{plural(len(plans), 'shard')}, {committed} of {plural(len(units), 'file')} committed")

    def result(self, previous: Ordered, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Sharded:
        by_shard: dict[str, list[TaskRecord]] = {}
        plans: dict[str, ShardPlan] = {}
        for task in plan.tasks.tasks:
            unit: Unit = task.job
            plans[unit.plan.name] = unit.plan
            by_shard.setdefault(unit.plan.name, []).append(committed[task.key])
        (table,) = plan.tasks.tables
        return Sharded(tuple(_shard_out(plans[name], records) for name, records in by_shard.items()), previous, table)

    def done(self, result: Sharded, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{plural(run.ran, 'file')} written, {run.cached} cached"


def _shard_out(plan: ShardPlan, records: list[TaskRecord]) -> ShardOut:
    """The shard from its units' records; IntegrityError when they record no source mix or units
    of it disagree (records of other code)."""
    outputs: dict[str, str] = {}
    sizes: dict[str, int] = {}
    mixes: set[SourceMix] = set()
    for record in records:
        outputs.update(record.outputs)
        sizes.update({fmt: int(size) for fmt, size in record.summary["sizes"].items()})
        try:
            mixes.add(SourceMix.from_json(record.summary["sources"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"task record shard/{record.key}: no usable source mix ({exc}); "
                                 "remove it and rebuild") from None
    if len(mixes) != 1:
        raise IntegrityError(f"shard {plan.name}: its units' records count its sources differently; "
                             "remove them and rebuild")
    (sources,) = mixes
    return ShardOut(plan, tuple(outputs.items()), tuple(sizes.items()), sources)


def _reads(missing: Sequence[Task[Unit]], parts: tuple[str, ...], buckets: Mapping[int, str]) -> list[list[str]]:
    """What the missing units read: every part's intermediate, then the buckets their slices name."""
    read = sorted({buckets[bucket] for task in missing for bucket, _, _ in task.job.plan.slices})
    return [list(parts), read]


@dataclass(frozen=True)
class Batching:
    """How the shard stage groups its missing units into jobs (what every job shares)."""

    store_url: str
    parts_table: str
    buckets: Mapping[int, str]
    dtype: str
    eos_id: int
    read_back: bool
    metadata_keys: tuple[str, ...] = ()

    def jobs(self, missing: Sequence[Task[Unit]], workers: int) -> list[AssembleJob]:
        return [AssembleJob(self.store_url, self.parts_table,
                            tuple(sorted({(b, self.buckets[b]) for unit in group for b, _, _ in unit.plan.slices})),
                            group, self.dtype, self.eos_id, self.read_back, self.metadata_keys)
                for group in unit_groups([task.job for task in missing], workers)]


def unit_groups(units: Sequence[Unit], workers: int) -> list[tuple[Unit, ...]]:
    """The shard jobs: runs of consecutive units of similar weight, SHARD_JOBS_PER_WORKER per
    worker, the heaviest first (the stage then ends with light jobs); which unit lands in which
    job changes no byte of any unit."""
    weights = [unit_weight(unit.plan, unit.unit) for unit in units]
    ranges = contiguous_ranges(weights, workers * SHARD_JOBS_PER_WORKER)
    ranges.sort(key=lambda bounds: -sum(weights[bounds[0]:bounds[1]]))
    return [tuple(units[start:end]) for start, end in ranges]


def unit_weight(plan: ShardPlan, unit: str) -> int:
    """About the bytes a unit writes, as its format weighs a shard."""
    return output_format(unit).weight(plan)
