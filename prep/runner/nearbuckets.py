"""The near-duplicate bucket stage (issue 42): one task per band-hash bucket gathers that bucket of
every part's bands object, pairs the documents that share a band hash (with `verify`, only those
whose true Jaccard reaches the threshold) and stores the bucket's pairs object. A task holds its
bucket's band records (20 bytes each) and, with `verify`, the texts of one slice of its candidate
pairs at a time (`neardedup.VERIFY_BYTES`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prep.hashing import pack_ids, unpack_ids
from prep.neardup.settings import NearDupSettings
from prep.progress import plural
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan, stage_counts
from prep.runner.tasks import TaskResult, store_written, stored_table, worker_store
from prep.runner.tokenizing import Tokenized
from prep.stages.cuts import bucket_bits
from prep.store.localcopy import local_file as fetch_local
from prep.store.records import TaskRecord

RECORDS_PER_BUCKET = 2_000_000
"""Target band records per bucket task (20 bytes each, twice while sorting): about 80 MB."""


@dataclass(frozen=True)
class BucketJob:
    """Pair one band bucket: `table` packs every part's bands object id in input order (then, with
    `verify`, every part's intermediate id, whose texts the pairs are checked on)."""

    store_url: str
    table: str
    bucket: int
    bits: int
    settings: NearDupSettings


def run_bucket_job(job: BucketJob) -> TaskResult:
    from prep.stages.neardedup import bucket_pairs, gather_bands, jaccard_filter, sizes_by_number, texts_by_number
    from prep.stages.tokenize import drop_engines
    from prep.workfiles.pairs import write_pairs

    drop_engines()
    store = worker_store(job.store_url)
    ids = unpack_ids(stored_table(store, job.table))
    parts = len(ids) // 2 if job.settings.verify else len(ids)
    sources = [(fetch_local(store, object_id), ordinal) for ordinal, object_id in enumerate(ids[:parts])]
    similar, rejected = None, 0
    if job.settings.verify:
        def intermediate(ordinal: int) -> Path:
            return fetch_local(store, ids[parts + ordinal])

        verify = jaccard_filter(partial(texts_by_number, intermediate), partial(sizes_by_number, intermediate),
                                job.settings.ngram, job.settings.threshold)

        def similar(left: Any, right: Any) -> Any:
            nonlocal rejected
            accepted = verify(left, right)
            rejected += len(accepted) - int(accepted.sum())
            return accepted

    def write(staged: Any) -> Any:
        pairs = bucket_pairs(gather_bands(sources, job.bucket, job.bits), similar)
        digest = write_pairs(staged, pairs, {"bucket": job.bucket, "bits": job.bits})
        verified = {"rejected": rejected} if job.settings.verify else {}
        return digest, {"pairs": len(pairs.left), "documents": len(pairs.documents), **verified}

    stored, summary = store_written(store, "near_buckets", write)
    return TaskResult({"pairs": stored}, summary, {})


@dataclass(frozen=True)
class Paired:
    """The bucket stage's result: the parts it read, the table of their objects, every bucket's pairs."""

    tokenized: Tokenized
    settings: NearDupSettings
    bits: int
    table: str
    pairs: tuple[str, ...]
    counts: tuple[int, ...]
    rejected: tuple[int, ...] | None = None  # with `verify`: each bucket's candidate pairs it rejected

    def manifest(self) -> dict[str, object]:
        return {"bits": self.bits, "table": self.table,
                "buckets": [{"bucket": bucket, "pairs": pairs, "count": count, **self._rejected(bucket)}
                            for bucket, (pairs, count) in enumerate(zip(self.pairs, self.counts))]}

    def _rejected(self, bucket: int) -> dict[str, int]:
        return {} if self.rejected is None else {"rejected": self.rejected[bucket]}

    @property
    def pairs_rejected(self) -> int | None:
        """Candidate pairs `verify` rejected over all buckets; None without `verify`."""
        return None if self.rejected is None else sum(self.rejected)


@dataclass(frozen=True)
class NearBuckets:
    """The bucket stage of near-duplicate removal under `settings`."""

    settings: NearDupSettings
    name: str = "near_buckets"

    def plan(self, previous: Tokenized, context: StageContext) -> StagePlan:
        bits = bucket_bits(previous.documents * self.settings.bands, RECORDS_PER_BUCKET)
        bands = [part.bands for part in previous.parts]
        if None in bands:
            raise ValueError("a tokenize part without its bands object under [dedup.near]")
        texts = [part.output for part in previous.parts] if self.settings.verify else []
        table = pack_ids([str(object_id) for object_id in bands] + texts)
        table_id = context.table_id(table)
        settings = {**self.settings.key_fields(), "bits": bits}
        keys = [context.task_key(self.name, settings, [table_id, bucket]) for bucket in range(1 << bits)]
        tasks = tuple(Task(key, BucketJob(context.store_url, table_id, bucket, bits, self.settings),
                           f"pairs of band bucket {bucket}", reads=(*unpack_ids(table), table_id))
                      for bucket, key in enumerate(keys))
        return StagePlan(TaskPlan(self.name, tasks, run_bucket_job, found=context.committed(self.name, keys),
                                  reads=_reads, tables={table_id: table}),
                         settings, [table_id], f"{plural(len(tasks), 'band bucket')} of {plural(len(bands), 'part')}")

    def result(self, previous: Tokenized, plan: StagePlan, committed: Mapping[str, TaskRecord]) -> Paired:
        job: BucketJob = plan.tasks.tasks[0].job
        records = [committed[task.key] for task in plan.tasks.tasks]
        rejected = tuple(int(record.summary["rejected"]) for record in records) if self.settings.verify else None
        return Paired(previous, self.settings, job.bits, job.table,
                      tuple(record.outputs["pairs"] for record in records),
                      tuple(int(record.summary["pairs"]) for record in records), rejected)

    def done(self, result: Paired, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        rejected = f" ({result.pairs_rejected} rejected by verify)" if result.pairs_rejected is not None else ""
        return f"{plural(sum(result.counts), 'candidate pair')}{rejected}, " + stage_counts(run)


def _reads(missing: Sequence[Task[BucketJob]]) -> list[list[str]]:
    """What the missing bucket tasks read, checked in one group before any runs."""
    return [sorted({object_id for task in missing for object_id in task.reads})]
