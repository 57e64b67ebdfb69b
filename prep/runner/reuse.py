"""Reused results are checked before anything uses them.

A build trusts an object it wrote itself (hashed while written), one it re-hashed in this
build, or one whose file in a local store still has the stamp it had when a build last hashed
it from the disk (prep.store.proven). Every other object a commit record names, and a stage is
about to read or a snapshot is about to name, is re-hashed first, on the executor's workers. A
corrupt or missing one is recomputed by the task that made it, whose put replaces a copy still
bad then (tasks are deterministic, so the recomputed object has the recorded id; anything else
is an IntegrityError, exit 3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prep.errors import IntegrityError
from prep.progress import Progress
from prep.runner.executors.base import Executor
from prep.runner.tasks import BatchResult, JobResult, publish_staged, worker_store
from prep.storage.backend import Store
from prep.store import cas, proven

JOBS_PER_WORKER = 4  # checks are split into this many jobs per worker: parallel, without a task per object


@dataclass(frozen=True)
class CheckJob:
    """Re-hash some stored objects."""

    store_url: str
    object_ids: tuple[str, ...]


def run_check_job(job: CheckJob) -> list[str]:
    """The objects of the job that are missing or do not hash to their names."""
    store = worker_store(job.store_url)
    return [object_id for object_id in job.object_ids if not cas.check(store, object_id)]


def executor_checker(store: Store, executor: Executor) -> Callable[[Sequence[str]], list[str]]:
    """Re-hash objects on the executor's workers, in a few jobs per worker (no task per object);
    returns the missing or corrupt ones."""
    def check(object_ids: Sequence[str]) -> list[str]:
        count = max(1, executor.workers * JOBS_PER_WORKER)
        jobs = [CheckJob(store.url, tuple(object_ids[start::count])) for start in range(min(count, len(object_ids)))]
        return [object_id for _, found in executor.run(run_check_job, jobs) for object_id in found]
    return check


@dataclass(frozen=True)
class Remake:
    """How to recompute a reused object: the task that produced it, and what to call it."""

    what: str
    fn: Callable[[Any], JobResult]
    job: Any
    reads: tuple[str, ...] = ()
    """Objects the task reads that a build may have reused too: made trustworthy before it runs."""


class ReuseGuard:
    """Tracks which objects this build may trust, and checks or recomputes the others."""

    def __init__(self, store: Store, executor: Executor, progress: Progress) -> None:
        self.store, self.executor, self.progress = store, executor, progress
        self.trusted: set[str] = set()
        self.remakes: dict[str, Remake] = {}
        self.recomputed: list[dict[str, str]] = []
        self.known: dict[str, cas.FileStamp] | None = None  # stamps of proven files, loaded when first needed

    def produced(self, object_ids: Iterable[str]) -> None:
        """Objects this build wrote (and hashed while writing)."""
        self.trusted.update(object_ids)

    def reused(self, object_ids: Iterable[str], remake: Remake) -> None:
        """Objects named by a commit record this build found; `remake` recomputes them."""
        for object_id in object_ids:
            self.remakes.setdefault(object_id, remake)

    def find_bad(self, object_ids: Iterable[str]) -> list[str]:
        """Re-hash the untrusted ones among `object_ids` (but those proven before whose file is
        unchanged); the corrupt or missing ones, sorted."""
        untrusted = set(object_ids) - self.trusted
        if untrusted and self.known is None:
            self.known = proven.load(self.store)
        self.trusted.update(proven.unchanged(self.store, untrusted, self.known or {}))
        todo = sorted(untrusted - self.trusted)
        bad, stamps = proven.check_stamped(self.store, todo, executor_checker(self.store, self.executor))
        self.trusted.update(set(todo) - set(bad))
        self.proved(stamps)
        return bad

    def proved(self, stamps: dict[str, cas.FileStamp]) -> None:
        """Record object files hashed from the disk in this build, with their stamps then."""
        proven.record(self.store, stamps)
        if self.known is not None:
            self.known.update(stamps)

    def discard(self, object_id: str, what: str) -> None:
        """Note a corrupt or missing object as to be recomputed."""
        # Not deleted here: another build may have repaired it since it was checked, and deleting
        # that copy would leave a snapshot already read back without it until the recompute
        # stores it again. The recomputing put replaces it only if it is still bad (prep.store.cas).
        self.progress.info(f"warning: {what} {object_id} is corrupt or missing in {self.store.url}; recomputing it")
        self.recomputed.append({"object": object_id, "what": what})

    def ensure(self, object_ids: Iterable[str]) -> None:
        """Make every object in `object_ids` trustworthy: check it, recompute it if it is bad."""
        bad = self.find_bad(object_ids)
        if not bad:
            return
        remakes: list[tuple[str, Remake]] = []
        for object_id in bad:
            remake = self.remakes.get(object_id)
            if remake is None:
                raise IntegrityError(f"{self.store.url}: object {object_id} is corrupt or missing, "
                                     "and no task of this build can recompute it")
            self.discard(object_id, remake.what)
            remakes.append((object_id, remake))
        self.ensure([read for _, remake in remakes for read in remake.reads])  # inputs of an earlier round
        for fn in {id(remake.fn): remake.fn for _, remake in remakes}.values():
            group = [(object_id, remake) for object_id, remake in remakes if remake.fn is fn]
            for index, result in self.executor.run(fn, [remake.job for _, remake in group]):
                object_id, remake = group[index]
                results = result.results if isinstance(result, BatchResult) else (("", result),)
                outputs = {f"{key}/{name}": object_id for key, one in results
                           for name, object_id in publish_staged(self.store, one).outputs.items()}
                if object_id not in outputs.values():
                    raise IntegrityError(f"{self.store.url}: recomputing {remake.what} {object_id} gave other bytes "
                                         f"({', '.join(sorted(outputs.values()))}): the task is not deterministic")
        self.trusted.update(bad)
