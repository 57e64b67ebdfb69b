"""`prep status PIPELINE`: what a build would run and what it would reuse, without running it.

Read-only, like `dvc status`: the inputs are discovered and hashed here (in this process, no
workers, no spool), the tokenize task keys are computed as the build computes them and looked
up among the committed task records (in the plan's packs, then single records: as a build
looks them up, without packing what it finds); each later stage's key follows from the output its
predecessor committed, so a stage is reported reused when its stage record exists for the key
computable now, and "would run" otherwise (then every stage after it would run too, since
their keys depend on outputs not made yet). With [dedup.near] the bucket and cluster stages
follow tokenize, keyed by the tables of what they read (order reads the tokenize output, not
theirs). Nothing is written to the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prep import hashing
from prep.code import code_identity
from prep.config import Pipeline
from prep.errors import PrepError
from prep.inputs.sources import SourceFile, discover, input_version
from prep.neardup.settings import NearDupSettings
from prep.runner.driver import LOOKUP_JOBS, PACK_RECORDS
from prep.runner.nearbuckets import RECORDS_PER_BUCKET
from prep.runner.ordering import DOCUMENTS_PER_BUCKET, Ordering
from prep.runner.planning import read_exclusions, tokenize_settings
from prep.runner.sharding import Sharding
from prep.runner.tasks import HashJob, run_hash_job
from prep.stages.cuts import bucket_bits
from prep.stages.read import plan_read_tasks
from prep.stages.specs import TokenizeSettings
from prep.storage.backend import Store
from prep.store import cas, packs, records
from prep.store.refs import read_ref
from prep.store.snapshots import Snapshot, load_snapshot
from prep.tokenizer import describe_tokenizer

REPORT_SCHEMA = "prep.status-report/1"  # manifests/status-report-1.schema.json
REUSED, WOULD_RUN = "reused", "would run"


@dataclass(frozen=True)
class InputChange:
    """One input file against the dataset's latest snapshot: added, removed, changed, unchanged."""

    path: str
    change: str
    size: int | None
    sha256: str | None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class PartStatus:
    """One tokenize task (a part of an input file) and whether its task record is committed."""

    source: str
    part: int
    key: str
    committed: bool

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "part": self.part, "key": self.key, "committed": self.committed}


@dataclass(frozen=True)
class StageStatus:
    """One stage: reused (its stage record exists for `key`) or would run, and why."""

    name: str
    state: str
    key: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "key": self.key, "reason": self.reason}


@dataclass(frozen=True)
class BuildStatus:
    """What a build of the pipeline would do now, against the store and the dataset's latest snapshot."""

    dataset: str
    store: str
    latest: Snapshot | None
    version: str
    inputs: tuple[InputChange, ...]
    parts: tuple[PartStatus, ...]
    stages: tuple[StageStatus, ...]

    @property
    def up_to_date(self) -> bool:
        """True when every stage is reused with the keys the latest snapshot records: a build
        would publish the latest snapshot again."""
        if self.latest is None or any(stage.state != REUSED for stage in self.stages):
            return False
        recorded = {stage["name"]: stage["key"] for stage in self.latest.manifest["stages"]}
        return all(recorded.get(stage.name) == stage.key for stage in self.stages) \
            and self.latest.manifest["inputs"]["version"] == self.version

    def to_json(self) -> dict[str, Any]:
        """The `prep.status-report/1` document."""
        return {"schema": REPORT_SCHEMA, "dataset": self.dataset, "store": self.store,
                "latest": self.latest.id if self.latest else None, "inputs_version": self.version,
                "up_to_date": self.up_to_date, "inputs": [entry.to_json() for entry in self.inputs],
                "tokenize_tasks": [part.to_json() for part in self.parts],
                "stages": [stage.to_json() for stage in self.stages]}


def _latest(store: Store, dataset: str) -> Snapshot | None:
    """The dataset's latest snapshot, None when there is none (or it is collected)."""
    try:
        ref = read_ref(store, dataset, "latest")
        return load_snapshot(store, ref.snapshot) if ref is not None and not ref.deleted else None
    except PrepError:
        return None


def input_changes(sources: list[SourceFile], latest: Snapshot | None) -> tuple[InputChange, ...]:
    """Each input file now against the latest snapshot's (sorted by path; removed ones included)."""
    before = {f["path"]: f for f in latest.manifest["inputs"]["files"]} if latest else {}
    changes = []
    for source in sources:
        old = before.pop(source.rel, None)
        change = "added" if old is None else "unchanged" if old["sha256"] == source.sha256 else "changed"
        changes.append(InputChange(source.rel, change, source.size, source.sha256))
    changes.extend(InputChange(path, "removed", None, None) for path in before)
    return tuple(sorted(changes, key=lambda entry: entry.path))


def _stage(store: Store, name: str, settings: Any, code: dict[str, Any], inputs: Any,
           blocked: str | None) -> tuple[StageStatus, records.StageRecord | None]:
    """A stage's status and, when reused, its stage record (whose output is the next stage's input)."""
    if blocked is not None:
        return StageStatus(name, WOULD_RUN, None, blocked), None
    key = records.content_key(name, settings, code, inputs)
    record = records.read_stage_record(store, name, key)
    if record is None:
        return StageStatus(name, WOULD_RUN, key, "no stage record for its key"), None
    return StageStatus(name, REUSED, key, "stage record committed"), record


def build_status(pipeline: Pipeline, store: Store, warn: Callable[[str], None]) -> BuildStatus:
    """What `prep build` of `pipeline` into `store` would run and reuse (reads only); each unusable
    task pack met on the way is `warn`ed about, as a build warns, and its tasks count as would run
    unless their own records answer (a pack may be their only copy)."""
    code = code_identity()
    tokenizer_path = pipeline.tokenizer_path()
    info = describe_tokenizer(tokenizer_path, pipeline.tokenizer.eos, pipeline.tokenizer.encode_special_tokens)
    discovered = discover(pipeline.input.paths, pipeline.base_dir, pipeline.input.format)
    sources = run_hash_job(HashJob(tuple(discovered), spool=False)) if discovered else []
    settings = tokenize_settings(pipeline, str(tokenizer_path), info.sha256, read_exclusions(pipeline))
    planned = [(source.rel, task.part, records.content_key("tokenize", settings.key_fields(), code, *task.key_parts()))
               for source in sources
               for task in plan_read_tasks(source, pipeline.input.text_field, pipeline.input.id_field,
                                           pipeline.input.max_document_bytes, pipeline.input.metadata_fields)]
    committed_parts = packs.find_committed(store, "tokenize", [key for _, _, key in planned], LOOKUP_JOBS,
                                           PACK_RECORDS, warn, repack=False)
    found = [committed_parts[key] for _, _, key in planned]
    parts = [PartStatus(source, part, key, record is not None) for (source, part, key), record in zip(planned, found)]
    documents = sum(int(record.summary.get("documents", 0)) for record in found if record)
    todo = sum(not part.committed for part in parts)
    blocked = f"{todo} of {len(parts)} tokenize tasks would run first" if todo else None
    tokenize, committed = _stage(store, "tokenize", settings.key_fields(), code, [p.key for p in parts], blocked)
    stages = [tokenize]
    if pipeline.dedup.near is not None:
        stages.extend(_near_stages(store, pipeline.dedup.near, code, found, documents, blocked))
    output, read = (committed.output if committed else None), "tokenize"
    for name, stage_settings in _later_stages(pipeline, settings, documents, info.dtype, info.eos_id):
        upstream = f"its input, the {read} stage, would run first" if output is None else None
        status, committed = _stage(store, name, stage_settings, code, [output], upstream)
        output, read = (committed.output if committed else None), name
        stages.append(status)
    latest = _latest(store, pipeline.dataset)
    return BuildStatus(pipeline.dataset, store.url, latest, input_version(sources), input_changes(sources, latest),
                       tuple(parts), tuple(stages))


def _near_stages(store: Store, near: NearDupSettings, code: dict[str, Any],
                 parts: Sequence[records.TaskRecord | None], documents: int, blocked: str | None) -> list[StageStatus]:
    """The near-duplicate bucket and cluster stages, keyed as they key themselves
    (prep/runner/nearbuckets.py, nearclusters.py): the buckets by the table of the parts' bands
    objects (and, with `verify`, their intermediates), the clusters by the table of the pairs
    objects the bucket stage's manifest lists. The order stage reads the tokenize output, not
    theirs: their state never blocks it."""
    bands = [record.outputs.get("bands") if record else None for record in parts]
    if blocked is None and None in bands:
        blocked = "a tokenize task record names no bands object"
    if blocked is not None:
        return [StageStatus(name, WOULD_RUN, None, blocked) for name in ("near_buckets", "near_clusters")]
    texts = [record.outputs["intermediate"] for record in parts if record] if near.verify else []
    settings = {**near.key_fields(), "bits": bucket_bits(documents * near.bands, RECORDS_PER_BUCKET)}
    buckets, record = _stage(store, "near_buckets", settings, code, [_table_id([*map(str, bands), *texts])], None)
    if record is None:
        return [buckets, StageStatus("near_clusters", WOULD_RUN, None, "its input, the near_buckets stage, would run first")]
    manifest = records.stage_manifest(store, record, cas.get_bytes(store, record.output))
    pairs = [str(bucket["pairs"]) for bucket in manifest["buckets"]]
    clusters, _ = _stage(store, "near_clusters", near.key_fields(), code, [_table_id(pairs)], None)
    return [buckets, clusters]


def _table_id(object_ids: list[str]) -> str:
    """The id of the table packing `object_ids`, as `StageContext.table_id` names a plan's table."""
    return hashing.digest_bytes(hashing.pack_ids(object_ids)).id


def _later_stages(pipeline: Pipeline, settings: TokenizeSettings, documents: int, dtype: str,
                  eos_id: int) -> list[tuple[str, dict[str, Any]]]:
    """The stage key settings of order and shard, as those stages name them."""
    bits = bucket_bits(documents, DOCUMENTS_PER_BUCKET)
    ordering = Ordering(pipeline.dedup.exact, pipeline.output.shard_size, dtype, pipeline.build.merge_fan_in)
    sharding = Sharding(pipeline.output.formats, pipeline.output.shard_size, dtype, eos_id, settings)
    return [("order", ordering.settings(bits)), ("shard", sharding.stage_settings())]
