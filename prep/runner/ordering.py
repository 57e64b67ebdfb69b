"""The global stages, partitioned: route (one task per tokenize part), order (one task per key
bucket: dedup, sort, cut), then shard (one task per shard unit). Each task's memory depends on
its own part, bucket or shard, never on the size of the corpus (docs/build.md, "Stage graph").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prep.faults import crash_point
from prep.formats.units import BIN, unit_formats, units_for
from prep.progress import plural
from prep.runner.planning import contiguous_ranges
from prep.runner.publish import stage_counts
from prep.runner.tasks import (
    AssembleJob,
    OrderJob,
    PartRef,
    RouteJob,
    run_assemble_job,
    run_order_job,
    run_route_job,
)
from prep.stages.cuts import ShardPlan, bucket_bits, plan_shards
from prep.store import records

if TYPE_CHECKING:
    from prep.runner.build import Builder

DOCUMENTS_PER_BUCKET = 250_000
"""Target documents per order task (about 170 bytes each in memory while sorting): no larger than
a shard unit's window and the tokenize parts' share, so no task's peak follows the corpus size;
small enough that even a 1M-document corpus gives every worker of a small pool an order task
(with 1M, one task took the whole stage while the other workers waited)."""


def route(builder: Builder, parts: tuple[PartRef, ...]) -> dict[str, Any]:
    """Route every part into key buckets; returns the route stage manifest (with `bits`)."""
    pipeline = builder.pipeline
    bits = bucket_bits(sum(part.documents for part in parts), DOCUMENTS_PER_BUCKET)
    settings = {"seed": pipeline.seed, "bits": bits}
    first_of_file: dict[str, int] = {}
    for ordinal, part in enumerate(parts):
        first_of_file.setdefault(part.source, ordinal)
    jobs = []
    for ordinal, part in enumerate(parts):
        same = tuple(p for i, p in enumerate(parts) if p.source == part.source and i != ordinal) \
            if first_of_file[part.source] == ordinal else ()
        key = records.content_key("route", settings, builder.code,
                                  [part.object_id, ordinal, [p.object_id for p in same]])
        jobs.append((key, RouteJob(builder.store.url, part, ordinal, pipeline.seed, bits, same)))
    builder.progress.stage("route", f"{len(jobs)} parts into {1 << bits} buckets")
    done = builder.run_tasks("route", jobs, run_route_job, describe=lambda job: f"route of part {job.ordinal}",
                             reads=[[part.object_id for part in parts]], weight=route_weight)
    stage_key = builder.stage_key("route", settings, [builder.stages["tokenize"].output])
    tasks = [{"part": ordinal, "key": key, "output": done[key].outputs["route"]} for ordinal, (key, _) in enumerate(jobs)]
    manifest = builder.commit_stage("route", stage_key, {"bits": bits, "tasks": tasks})
    builder.progress.done("route", stage_counts(builder.stages['route']))
    return manifest


def route_weight(job: RouteJob) -> int:
    """Documents a route task reads: a file's first part also reads its other parts' ids."""
    return job.part.documents + sum(part.documents for part in job.same_file)


def order(builder: Builder, route_manifest: dict[str, Any], itemsize: int, dtype: str) -> dict[str, Any]:
    """Dedup, sort and cut every bucket; returns the order stage manifest."""
    pipeline = builder.pipeline
    bits = int(route_manifest["bits"])
    settings = {"exact": pipeline.dedup.exact, "shard_size": pipeline.output.shard_size, "dtype": dtype}
    route_out, tokenize_out = builder.stages["route"].output, builder.stages["tokenize"].output
    jobs = [(records.content_key("order", settings, builder.code, [route_out, bucket]),
             OrderJob(builder.store.url, route_out, tokenize_out, bucket, bits, pipeline.dedup.exact,
                      pipeline.output.shard_size, itemsize))
            for bucket in range(1 << bits)]
    builder.progress.stage("order", f"{len(jobs)} buckets")
    done = builder.run_tasks("order", jobs, run_order_job, describe=lambda job: f"bucket {job.bucket}",
                             reads=[[task["output"] for task in route_manifest["tasks"]]])
    stage_key = builder.stage_key("order", settings, [route_out])
    buckets = [{"bucket": job.bucket, "key": key, "output": done[key].outputs["bucket"], **done[key].summary}
               for key, job in jobs]
    manifest = builder.commit_stage("order", stage_key, {"bits": bits, "buckets": buckets})
    dropped = sum(int(b["duplicates_dropped"]) for b in buckets)
    builder.progress.done("order", f"{sum(int(b['documents']) for b in buckets)} documents kept, {dropped} duplicates")
    return manifest


def shard(builder: Builder, parts: tuple[PartRef, ...], order_manifest: dict[str, Any], dtype: str,
          eos_id: int) -> list[dict[str, Any]]:
    """Write every shard's units (bin: .bin and .idx; wds: .tar), each with its own task record
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
    weights = [plan.bin_size if unit == BIN else plan.bin_size + plan.text_bytes for plan, unit in missing]
    groups = [tuple(missing[start:end]) for start, end in contiguous_ranges(weights, builder.executor.workers)]
    jobs = [AssembleJob(builder.store.url, parts,
                        tuple(sorted({(b, bucket_ids[b]) for plan, _ in group for b, _, _ in plan.slices})),
                        group, dtype, eos_id) for group in groups]
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
