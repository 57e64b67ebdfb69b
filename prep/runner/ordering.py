"""The order stage, partitioned: one task per key bucket gathers the bucket from every part's
entries (or the runs merged from them), drops exact duplicates, sorts and cuts it into leaves.
Each task's memory depends on its own bucket, never on the size of the corpus (docs/build.md,
"Stage graph")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prep.manifest import canonical
from prep.progress import plural
from prep.runner.distributions import OrderQuality, order_quality
from prep.runner.merging import Level, Source, merged_sources
from prep.runner.nearclusters import Clustered, NearCounts
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan
from prep.runner.tasks import TaskResult, store_written, stored_table, worker_store
from prep.runner.tokenizing import Tokenized
from prep.stages.cuts import bucket_bits
from prep.stages.specs import PartTable
from prep.store import cas
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord

DOCUMENTS_PER_BUCKET = 250_000
"""Target documents per order task (about 170 bytes each in memory while sorting): no larger than
a shard unit's window, so no task's peak follows the corpus size;
small enough that even a 1M-document corpus gives every worker of a small pool an order task
(with 1M, one task took the whole stage while the other workers waited)."""


@dataclass(frozen=True)
class CheckedPart:
    """A part of a file split into several, whose ids an order task checks across the parts."""

    object_id: str
    source: str
    documents: int


@dataclass(frozen=True)
class IdChecks:
    """The files split into several parts whose ids one order task checks, each as its parts: a
    table the job names by id, since a file of a terabyte is some 30,000 parts."""

    files: tuple[tuple[CheckedPart, ...], ...]

    @property
    def documents(self) -> int:
        """The documents whose ids the task reads."""
        return sum(part.documents for same in self.files for part in same)

    def to_bytes(self) -> bytes:
        return canonical.dumps([[[part.object_id, part.source, part.documents] for part in same] for same in self.files])

    @classmethod
    def from_bytes(cls, data: bytes) -> IdChecks:
        return cls(tuple(tuple(CheckedPart(str(object_id), str(source), int(documents))
                               for object_id, source, documents in same) for same in json.loads(data)))


@dataclass(frozen=True)
class OrderJob:
    """Dedup, sort and cut one key bucket: reads the bucket's entries from `sources`, the parts'
    entries objects or the runs merged from them, each with its first part's ordinal;
    `parts_table` is the object id of the PartTable of every part's source and line offset, which
    leaf digests name (stored once by the runner, so a job stays small however many parts). `check_ids` lists files
    split into several parts whose ids this task checks across the parts (ids must be unique
    within a file; each tokenize task checked its own part): a file's parts are in the tokenize
    stage manifest, so the task's key covers them. The key does not cover `sources`: runs or
    parts, the bucket's entries are the same. `sources` are at most [build] merge_fan_in (512 at
    most: 40 KB); `check_ids` is a table named by id (`IdChecks`), since a file of a terabyte is
    some 30,000 parts, so a job stays small however large the corpus or its files."""

    store_url: str
    parts_table: str
    bucket: int
    bits: int
    exact: bool
    shard_size: int
    itemsize: int
    sources: tuple[tuple[str, int], ...]
    check_ids: str | None = None
    drops: str | None = None  # with [dedup.near]: the drops object, whose bucket this task removes too


def run_order_job(job: OrderJob) -> TaskResult:
    from prep.stages.idcheck import check_unique_ids
    from prep.stages.order import order_bucket
    from prep.stages.tokenize import drop_engines

    drop_engines()
    store = worker_store(job.store_url)
    checks = IdChecks.from_bytes(cas.get_bytes(store, job.check_ids)) if job.check_ids is not None else IdChecks(())
    for same_file in checks.files:
        check_unique_ids(same_file[0].source, [fetch_local(store, part.object_id) for part in same_file],
                         store.staging_dir())
    sources = [(fetch_local(store, object_id), first_part) for object_id, first_part in job.sources]
    parts = PartTable.from_bytes(stored_table(store, job.parts_table))
    drops = fetch_local(store, job.drops) if job.drops is not None else None
    stored, summary = store_written(store, "order", lambda staged: order_bucket(
        sources, parts, job.bucket, job.bits, job.exact, job.shard_size, job.itemsize, staged, drops))
    return TaskResult({"bucket": stored}, summary, {})


@dataclass(frozen=True)
class Leaf:
    """A shard-sized key range one order task cut from its bucket (prep.stages.order.split_leaves)."""

    start: str
    depth: int
    first: int
    count: int
    tokens: int
    bin_size: int
    text_bytes: int
    digest: str

    def to_json(self) -> dict[str, object]:
        return {"start": self.start, "depth": self.depth, "first": self.first, "count": self.count,
                "tokens": self.tokens, "bin_size": self.bin_size, "text_bytes": self.text_bytes,
                "digest": self.digest}


@dataclass(frozen=True)
class OrderedBucket:
    """One committed order task: its bucket object and what the task counted."""

    bucket: int
    key: str
    output: str
    documents_read: int
    duplicates_dropped: int
    documents: int
    bin_size: int
    text_bytes: int
    digest: str
    leaves: tuple[Leaf, ...]
    near_duplicates_dropped: int | None = None  # with [dedup.near]

    def to_json(self) -> dict[str, object]:
        near = {"near_duplicates_dropped": self.near_duplicates_dropped} if self.near_duplicates_dropped is not None else {}
        return {"bucket": self.bucket, "key": self.key, "output": self.output, "documents_read": self.documents_read,
                "duplicates_dropped": self.duplicates_dropped, **near, "documents": self.documents,
                "bin_size": self.bin_size, "text_bytes": self.text_bytes, "digest": self.digest,
                "leaves": [leaf.to_json() for leaf in self.leaves]}

    @classmethod
    def of(cls, bucket: int, key: str, record: TaskRecord) -> OrderedBucket:
        summary = record.summary
        leaves = tuple(Leaf(str(leaf["start"]), int(leaf["depth"]), int(leaf["first"]), int(leaf["count"]),
                            int(leaf["tokens"]), int(leaf["bin_size"]), int(leaf["text_bytes"]), str(leaf["digest"]))
                       for leaf in summary["leaves"])
        return cls(bucket, key, record.outputs["bucket"], int(summary["documents_read"]),
                   int(summary["duplicates_dropped"]), int(summary["documents"]), int(summary["bin_size"]),
                   int(summary["text_bytes"]), str(summary["digest"]), leaves,
                   None if "near_duplicates_dropped" not in summary else int(summary["near_duplicates_dropped"]))


@dataclass(frozen=True)
class Ordered:
    """The order stage's result: the key bits and every bucket, in key order, with the parts
    they were ordered from and the part table object its tasks read."""

    bits: int
    buckets: tuple[OrderedBucket, ...]
    tokenized: Tokenized
    parts_table: str  # the PartTable object every order task read
    quality: OrderQuality  # the buckets' token lengths and per-part counts, summed
    near: NearCounts | None = None  # with [dedup.near]: what its stages counted (not in the order manifest)
    id_checks: tuple[str, ...] = ()  # the IdChecks tables of the tasks that checked split files' ids

    def manifest(self) -> dict[str, object]:
        checks = {"id_checks": list(self.id_checks)} if self.id_checks else {}
        return {"bits": self.bits, "buckets": [bucket.to_json() for bucket in self.buckets],
                "parts_table": self.parts_table, **checks}

    @property
    def duplicates_dropped(self) -> int:
        return sum(bucket.duplicates_dropped for bucket in self.buckets)

    @property
    def near_duplicates_dropped(self) -> int | None:
        """Documents near-duplicate removal dropped; None when the build removes none."""
        counts = [bucket.near_duplicates_dropped for bucket in self.buckets]
        return None if None in counts else sum(count or 0 for count in counts)


@dataclass(frozen=True)
class Ordering:
    """The order stage: exact dedup (`exact`), key order and leaves of at most `shard_size` bytes
    of `dtype` tokens; parts merged first in rounds of `merge_fan_in` when they are more."""

    exact: bool
    shard_size: int
    dtype: str
    merge_fan_in: int
    name: str = "order"

    def settings(self, bits: int) -> dict[str, object]:
        """What the order stage's keys hash besides its input: dedup, shard size, token dtype, buckets."""
        return {"exact": self.exact, "shard_size": self.shard_size, "dtype": self.dtype, "bits": bits}

    def plan(self, previous: Tokenized | Clustered, context: StageContext) -> StagePlan:
        """The order tasks over the parts; with near-duplicate removal, each reads the drops too."""
        if isinstance(previous, Clustered):
            return self._plan(previous.tokenized, previous.drops, context)
        return self._plan(previous, None, context)

    def _plan(self, previous: Tokenized, drops: str | None, context: StageContext) -> StagePlan:
        bits = bucket_bits(previous.documents, DOCUMENTS_PER_BUCKET)
        tokenized = context.stage_output("tokenize")
        near = [drops] if drops is not None else []
        keys = [context.task_key("order", self.settings(bits), [tokenized, bucket, *near])
                for bucket in range(1 << bits)]
        found = context.committed("order", keys)
        parts = Level(tuple(Source(part.entries, ordinal, part.documents) for ordinal, part in enumerate(previous.parts)))
        # Every bucket committed: nothing is merged, and a bucket found bad is remade from the parts.
        sources = merged_sources(context, parts, self.merge_fan_in) if None in found.values() else parts
        listed = tuple((source.object_id, source.first_part) for source in sources.sources)
        table = PartTable.of([(part.source, part.line_offset) for part in previous.parts]).to_bytes()
        table_id = context.table_id(table)
        tables = {table_id: table}
        itemsize = 2 if self.dtype == "uint16" else 4
        checks = _id_checks(previous, 1 << bits)
        tasks = []
        checks_ids = {bucket: context.table_id(checked.to_bytes()) for bucket, checked in checks.items()}
        tables.update({checks_ids[bucket]: checked.to_bytes() for bucket, checked in checks.items()})
        for bucket, key in enumerate(keys):
            checked = checks.get(bucket, IdChecks(()))
            job = OrderJob(context.store_url, table_id, bucket, bits, self.exact, self.shard_size, itemsize, listed,
                           checks_ids.get(bucket), drops)
            tasks.append(Task(key, job, f"bucket {bucket}", checked.documents, reads=_order_reads(job, checked)))
        merged = f"{plural(len(sources.sources), 'run')} of " if sources is not parts else ""
        return StagePlan(TaskPlan("order", tuple(tasks), run_order_job, found=found, reads=_reads, tables=tables),
                         self.settings(bits), [tokenized],
                         f"{plural(len(tasks), 'bucket')} from {merged}{plural(len(previous.parts), 'part')}")

    def result(self, previous: Tokenized | Clustered, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Ordered:
        jobs = [(task.key, task.job) for task in plan.tasks.tasks]
        tokenized, near = (previous.tokenized, previous.counts) if isinstance(previous, Clustered) else (previous, None)
        quality = order_quality(len(tokenized.parts), [(key, committed[key].summary) for key, _ in jobs])
        return Ordered(jobs[0][1].bits, tuple(OrderedBucket.of(job.bucket, key, committed[key]) for key, job in jobs),
                       tokenized, jobs[0][1].parts_table, quality, near,
                       tuple(job.check_ids for _, job in jobs if job.check_ids is not None))

    def done(self, result: Ordered, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        kept = sum(bucket.documents for bucket in result.buckets)
        return f"{plural(kept, 'document')} kept, {plural(result.duplicates_dropped, 'duplicate')}"


def _reads(missing: Sequence[Task[OrderJob]]) -> list[list[str]]:
    """What the missing order tasks read, checked in one group before any runs."""
    return [sorted({object_id for task in missing for object_id in task.reads})]


def _order_reads(job: OrderJob, checked: IdChecks) -> tuple[str, ...]:
    """What an order task reads: its sources, the part table, the intermediates of the files
    whose ids it checks (and their table) and the near-duplicate drops."""
    named = (job.parts_table, job.check_ids, job.drops)
    return (*(object_id for object_id, _ in job.sources), *(object_id for object_id in named if object_id is not None),
            *(part.object_id for same in checked.files for part in same))


def _id_checks(tokenized: Tokenized, buckets: int) -> dict[int, IdChecks]:
    """The files split into several parts (ids must be unique within a file, and a tokenize task
    checks only its own part), each given to one order task: the i-th such file to bucket i mod
    `buckets`, so which task checks a file depends on the data alone. A task's weight is the
    documents whose ids it reads (its bucket's size is about the same for every task)."""
    by_file: dict[str, list[CheckedPart]] = {}
    for part in tokenized.parts:
        by_file.setdefault(part.source, []).append(CheckedPart(part.output, part.source, part.documents))
    split = [tuple(same) for same in by_file.values() if len(same) > 1]
    checks: dict[int, tuple[tuple[CheckedPart, ...], ...]] = {}
    for index, same in enumerate(split):
        checks[index % buckets] = (*checks.get(index % buckets, ()), same)
    return {bucket: IdChecks(files) for bucket, files in checks.items()}
