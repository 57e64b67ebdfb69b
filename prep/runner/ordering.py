"""The global stages, partitioned: order (one task per key bucket: gather it from every part's
entries, dedup, sort, cut), then shard (one task per shard unit). Each task's memory depends on
its own bucket or shard, never on the size of the corpus (docs/build.md, "Stage graph").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prep.faults import crash_point
from prep.formats.registry import output_format
from prep.formats.units import unit_formats, units_for
from prep.progress import plural
from prep.runner.merging import order_sources
from prep.runner.planning import contiguous_ranges
from prep.runner.tasks import (
    AssembleJob,
    OrderJob,
    PartRef,
    run_assemble_job,
    run_order_job,
)
from prep.stages.cuts import ShardPlan, bucket_bits, plan_shards
from prep.stages.specs import PartTable, ShardParts
from prep.store import records

if TYPE_CHECKING:
    from prep.config import Pipeline
    from prep.runner.build import Builder

SHARD_JOBS_PER_WORKER = 4
"""Shard units are grouped into this many jobs per worker (a job carries the parts table, so not
one per unit), handed out largest first: one slow job no longer leaves the other workers idle for
the rest of the stage, as one job per worker did (16M documents: 5.0 s against 3.2 s)."""

DOCUMENTS_PER_BUCKET = 250_000
"""Target documents per order task (about 170 bytes each in memory while sorting): no larger than
a shard unit's window, so no task's peak follows the corpus size;
small enough that even a 1M-document corpus gives every worker of a small pool an order task
(with 1M, one task took the whole stage while the other workers waited)."""


def order(builder: Builder, parts: tuple[PartRef, ...], itemsize: int, dtype: str) -> dict[str, Any]:
    """Dedup, sort and cut every key bucket from the parts' entries (merged first when they are
    many, and only when some bucket must be ordered); returns the order stage manifest."""
    pipeline = builder.pipeline
    bits = bucket_bits(sum(part.documents for part in parts), DOCUMENTS_PER_BUCKET)
    settings = order_settings(pipeline, bits, dtype)
    tokenize_out = builder.stages["tokenize"].output
    keys = [records.content_key("order", settings, builder.code, [tokenize_out, bucket]) for bucket in range(1 << bits)]
    found = {key: records.read_task_record(builder.store, "order", key) for key in keys}
    # Every bucket committed: nothing is merged, and a bucket found bad is remade from the parts.
    sources = order_sources(builder, parts) if None in found.values() else ()
    listed = tuple((source.object_id, source.first_part) for source in sources) or tuple(
        (part.entries_id, ordinal) for ordinal, part in enumerate(parts))
    checks = _id_checks(parts, 1 << bits)
    table = PartTable.of([(part.source, part.line_offset) for part in parts])
    jobs = [(key, OrderJob(builder.store.url, table, bucket, bits, pipeline.dedup.exact,
                           pipeline.output.shard_size, itemsize, listed, checks.get(bucket, ())))
            for bucket, key in enumerate(keys)]
    read_from = f"{plural(len(sources), 'run')} of " if len(sources) < len(parts) and sources else ""
    builder.progress.stage("order", f"{plural(len(jobs), 'bucket')} from {read_from}{plural(len(parts), 'part')}")
    checked = [part.object_id for _, job in jobs for same in job.check_ids for part in same]
    done = builder.run_tasks("order", jobs, run_order_job, describe=lambda job: f"bucket {job.bucket}",
                             reads=[[source.object_id for source in sources] + checked], weight=order_weight,
                             inputs_of=_order_inputs, found=found)
    stage_key = builder.stage_key("order", settings, [tokenize_out])
    buckets = [{"bucket": job.bucket, "key": key, "output": done[key].outputs["bucket"], **done[key].summary}
               for key, job in jobs]
    manifest = builder.commit_stage("order", stage_key, {"bits": bits, "buckets": buckets})
    dropped = sum(int(b["duplicates_dropped"]) for b in buckets)
    builder.progress.done("order", f"{plural(sum(int(b['documents']) for b in buckets), 'document')} kept, "
                                   f"{plural(dropped, 'duplicate')}")
    return manifest


def _order_inputs(job: OrderJob) -> list[str]:
    """What an order task reads: its sources and the intermediates of the files whose ids it checks."""
    return [object_id for object_id, _ in job.sources] + [part.object_id for same in job.check_ids for part in same]


def order_settings(pipeline: Pipeline, bits: int, dtype: str) -> dict[str, Any]:
    """What the order stage's keys hash besides its input: dedup, shard size, token dtype, buckets."""
    return {"exact": pipeline.dedup.exact, "shard_size": pipeline.output.shard_size, "dtype": dtype, "bits": bits}


def _id_checks(parts: tuple[PartRef, ...], buckets: int) -> dict[int, tuple[tuple[PartRef, ...], ...]]:
    """The files split into several parts (ids must be unique within a file, and a tokenize task
    checks only its own part), each given to one order task: the i-th such file to bucket i mod
    `buckets`, so which task checks a file depends on the data alone."""
    by_file: dict[str, list[PartRef]] = {}
    for part in parts:
        by_file.setdefault(part.source, []).append(part)
    split = [tuple(same) for same in by_file.values() if len(same) > 1]
    checks: dict[int, tuple[tuple[PartRef, ...], ...]] = {}
    for index, same in enumerate(split):
        checks[index % buckets] = (*checks.get(index % buckets, ()), same)
    return checks


def order_weight(job: OrderJob) -> int:
    """What an order task reads besides its bucket: the ids of the files it checks (its bucket's
    size is about the same for every task)."""
    return sum(part.documents for same in job.check_ids for part in same)


def shard(builder: Builder, parts: tuple[PartRef, ...], order_manifest: dict[str, Any], dtype: str,
          eos_id: int) -> list[dict[str, Any]]:
    """Write every shard's units (one per output format), each with its own task record
    keyed by the shard's content digest, so an unchanged shard is never written again."""
    formats = builder.pipeline.output.formats
    assert builder.tokenize_settings is not None
    # A unit's bytes follow from its digest (keys stand for texts), the tokenizer and these.
    settings = {"dtype": dtype, "eos_id": eos_id, "tokenize": builder.tokenize_settings.key_fields()}
    stage_key = builder.stage_key("shard", {**settings, "formats": list(formats)}, [builder.stages["order"].output])
    plans = plan_shards(order_manifest["buckets"], int(order_manifest["bits"]), builder.pipeline.output.shard_size)
    bucket_ids = {int(b["bucket"]): str(b["output"]) for b in order_manifest["buckets"]}
    all_units = [(plan, unit) for plan in plans for unit in units_for(formats)]
    keys = {(plan.name, unit): records.content_key("shard", settings, builder.code, unit, plan.name, plan.depth,
                                                   plan.digest) for plan, unit in all_units}
    found = {(plan.name, unit): records.read_task_record(builder.store, "shard", keys[plan.name, unit])
             for plan, unit in all_units}
    missing = _units_to_write(builder, all_units, found)
    committed = f"{len(all_units) - len(missing)} of {plural(len(all_units), 'file')} committed"
    builder.progress.stage("shard", f"{plural(len(plans), 'shard')}, {committed}")
    if missing:
        builder.guard.ensure([part.object_id for part in parts])
        builder.guard.ensure(sorted({bucket_ids[b] for plan, _ in missing for b, _, _ in plan.slices}))
    groups = unit_groups(missing, builder.executor.workers)
    table = ShardParts.of([(part.object_id, part.source, part.line_offset) for part in parts])
    jobs = [AssembleJob(builder.store.url, table,
                        tuple(sorted({(b, bucket_ids[b]) for plan, _ in group for b, _, _ in plan.slices})),
                        group, dtype, eos_id, builder.read_back) for group in groups]
    run = builder.stages["shard"]
    cached, written = len(all_units) - len(missing), 0
    builder.progress.tick("shard", cached, len(all_units), cached, force=True)
    for index, result in builder.executor.run(run_assemble_job, jobs):
        builder.guard.produced(result.outputs.values())
        builder.guard.read_back_when_written(result.read_back)
        for plan, unit in groups[index]:
            crash_point("shard.before_commit")
            found[plan.name, unit] = records.write_task_record(
                builder.store, "shard", keys[plan.name, unit],
                {fmt: result.outputs[f"{plan.name}/{fmt}"] for fmt in unit_formats(unit)},
                {"sizes": {fmt: result.summary["sizes"][f"{plan.name}/{fmt}"] for fmt in unit_formats(unit)}})
            run.ran += 1
        written += sum(int(size) for size in result.summary["sizes"].values())
        builder.progress.tick("shard", cached + run.ran, len(all_units), cached, written, force=True)
    run.cached = cached
    shards = [_shard_entry(plan, [found[plan.name, unit] for unit in units_for(formats)]) for plan in plans]
    builder.commit_stage("shard", stage_key, {"shards": shards})
    builder.progress.done("shard", f"{plural(run.ran, 'file')} written, {run.cached} cached")
    return shards


def unit_groups(units: list[tuple[ShardPlan, str]], workers: int) -> list[tuple[tuple[ShardPlan, str], ...]]:
    """The shard jobs: runs of consecutive units of similar weight, SHARD_JOBS_PER_WORKER per
    worker, the heaviest first (the stage then ends with light jobs); which unit lands in which
    job changes no byte of any unit."""
    weights = [unit_weight(plan, unit) for plan, unit in units]
    ranges = contiguous_ranges(weights, workers * SHARD_JOBS_PER_WORKER)
    ranges.sort(key=lambda bounds: -sum(weights[bounds[0]:bounds[1]]))
    return [tuple(units[start:end]) for start, end in ranges]


def unit_weight(plan: ShardPlan, unit: str) -> int:
    """About the bytes a unit writes, as its format weighs a shard."""
    return output_format(unit).weight(plan)


def _units_to_write(builder: Builder, all_units: list[tuple[ShardPlan, str]],
                    found: dict[tuple[str, str], records.TaskRecord | None]) -> list[tuple[ShardPlan, str]]:
    """Units without a record, or whose recorded files fail their check (those are discarded)."""
    bad = set(builder.guard.find_bad(oid for record in found.values() if record for oid in record.outputs.values()))
    missing = []
    for plan, unit in all_units:
        record = found[plan.name, unit]
        spoiled = sorted(bad & set(record.outputs.values())) if record else []
        if record is None or spoiled:
            missing.append((plan, unit))
        for object_id in spoiled:
            builder.guard.discard(object_id, f"shard {plan.name} {unit} file")
    return missing


def _shard_entry(plan: ShardPlan, unit_records: list[records.TaskRecord | None]) -> dict[str, Any]:
    """A shard as the shard stage manifest lists it: its plan, its files and their sizes."""
    outputs: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for record in unit_records:
        assert record is not None
        outputs.update(record.outputs)
        sizes.update(record.summary["sizes"])
    return {**plan.to_json(), "outputs": outputs, "sizes": sizes}
