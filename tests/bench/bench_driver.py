"""Benchmark (not a test): how many tasks a second the build driver plans, runs and commits
against S3 with a round trip's latency on every request (issue 44).

    python -m tests.bench.bench_driver [--tasks 2000] [--latency-ms 20] [--workers 64] [--runs 1]

moto's S3 server on loopback, each request held `--latency-ms` before moto answers it (nearer
real S3 than loopback's fraction of a millisecond; requests overlap, as on S3). A toy stage of
`--tasks` near-empty tasks: each stores one small object (its worker's PUT), and the driver commits
its record; with `--store-nothing` too, the same again with tasks that store nothing (each names
one object stored beforehand), so what bounds the driver itself shows. The workers are
`--workers` threads of this process (standing in for that many cores elsewhere: a task costs the
driver only its result and its commit). Measured, side by side in one run, for the driver as
built (settled tasks committed in groups, one pack of at most `PACK_RECORDS` a group), for it
committing a record a task (`PACK_RECORDS = 0`: a PUT a task, a GET a task on resume), and with
that and its lookups and commits one at a time (`LOOKUP_JOBS = COMMIT_JOBS = 1`: the driver
before issue 44, less the HEAD before each GET and the HEAD and GET after each PUT it also made then):

* first build: tasks planned (N lookups, all missing), run and committed per second of wall time,
  and the commit objects it stored (packs and single records);
* resume: the same stage again in a new runner, every record found: tasks planned per second;
* CPU seconds per 1,000 tasks of this process: the driver and the worker threads' requests
  (moto serves from a process of its own), so an upper bound on the driver's;
* moto's own ceiling: the same number of bare PUTs from `--workers` threads, no prep;
* planning at scale (`--scale-tasks`, default 600,000; 0 skips it): the lookup a first build of
  that many tasks makes (nothing committed: listings, no request a task), then that many records
  shaped like tokenize tasks' (two outputs, the seven counts of the summary) stored as packs of
  `PACK_RECORDS` and the lookup a resume of their plan makes (`packs.find_committed`): wall and
  CPU seconds, every record found. The stage's own planning (its task keys) is not in it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any

from moto.server import ThreadedMotoServer

from prep.progress import Progress
from prep.runner import driver
from prep.runner.driver import Runner
from prep.runner.stage import StageContext, StagePlan, StageRun, Task, TaskPlan
from prep.runner.tasks import TaskResult, worker_store
from prep.storage.backend import Store
from prep.storage.s3.s3store import S3Store
from prep.store import cas, packs, records
from tests.s3support import admin_client, s3_env

CODE = {"bench": "driver"}


class Delayed:
    """A WSGI app answering each request `latency` seconds late (in the request's own thread)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], latency: float) -> None:
        self.app, self.latency = app, latency

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        time.sleep(self.latency)
        return self.app(environ, start_response)


class ThreadExecutor:
    """`workers` threads running task functions, yielding results as they complete (for the bench:
    the driver's view of a cluster of that many cores)."""

    shares_filesystem = False

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        with ThreadPoolExecutor(self.workers, thread_name_prefix="bench-worker") as pool:
            queue = list(enumerate(items))[::-1]
            pending: dict[Future[Any], int] = {}
            while queue or pending:
                while queue and len(pending) < self.workers:
                    index, item = queue.pop()
                    pending[pool.submit(fn, item)] = index
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield pending.pop(future), future.result()

    def warm(self, warm_up: Any) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class StoreJob:
    """One near-empty task: store `payload` as an object, or, when `stored` names one already
    stored, store nothing and name it."""

    store_url: str
    payload: bytes
    stored: str | None = None


def run_store_job(job: StoreJob) -> TaskResult:
    if job.stored is not None:
        return TaskResult({"out": job.stored}, {}, {})
    return TaskResult({"out": cas.put_bytes(worker_store(job.store_url), job.payload).id}, {}, {})


@dataclass(frozen=True)
class Stored:
    objects: tuple[str, ...]

    def manifest(self) -> None:
        return None


@dataclass(frozen=True)
class ManyTasks:
    """A stage of `count` near-empty tasks."""

    count: int
    stored: str | None = None
    name: str = "bench"

    def plan(self, previous: None, context: StageContext) -> StagePlan:
        payloads = [f"task {index}".encode() for index in range(self.count)]
        tasks = tuple(Task(context.task_key(self.name, {}, hashlib.sha256(payload).hexdigest()),
                           StoreJob(context.store_url, payload, self.stored), f"task {index}")
                      for index, payload in enumerate(payloads))
        return StagePlan(TaskPlan(self.name, tasks, run_store_job), {}, [], f"{self.count} tasks")

    def result(self, previous: None, plan: StagePlan, committed: Mapping[str, records.TaskRecord]) -> Stored:
        return Stored(tuple(committed[task.key].outputs["out"] for task in plan.tasks.tasks))

    def done(self, result: Stored, run: StageRun, logs: Sequence[Mapping[str, object]]) -> str:
        return f"{run.ran} ran, {run.cached} cached"


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float


def timed(action: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return Timing(time.perf_counter() - wall, time.process_time() - cpu)


def stage_run(store: Store, tasks: int, workers: int, stored: str | None) -> Timing:
    runner = Runner(store, ThreadExecutor(workers), Progress(quiet=True), CODE)
    return timed(lambda: runner.run_stage(ManyTasks(tasks, stored), None))


def commit_objects(store: Store) -> int:
    """The packs and single task records in `store`: the commits' PUTs."""
    return sum(1 for prefix in ("packs/", "tasks/") for _ in store.list(prefix))


def bare_puts(store: Store, tasks: int, workers: int) -> Timing:
    payloads = [f"bare {index} {time.time_ns()}".encode() for index in range(tasks)]
    with ThreadPoolExecutor(workers) as pool:
        return timed(lambda: list(pool.map(lambda data: cas.put_bytes(store, data), payloads)))


def new_store(name: str) -> S3Store:
    admin_client().create_bucket(Bucket=name)
    return S3Store(f"s3://{name}/store")


MODES = ("one at a time", "a PUT a task", "grouped")


@dataclass(frozen=True)
class Measured:
    """One mode's first build and resume, and the commit objects the first build stored."""

    first: Timing
    resume: Timing
    commits: int


def measure(mode: str, tasks: int, workers: int, run: int, store_nothing: bool) -> Measured:
    lookups, commits, packed = driver.LOOKUP_JOBS, driver.COMMIT_JOBS, driver.PACK_RECORDS
    if mode == "one at a time":
        driver.LOOKUP_JOBS = driver.COMMIT_JOBS = 1
    if mode != "grouped":
        driver.PACK_RECORDS = 0
    try:
        store = new_store(f"bench-{run}-{mode.replace(' ', '-')}-{'empty' if store_nothing else 'one'}")
        stored = cas.put_bytes(store, b"the one object every task names").id if store_nothing else None
        first = stage_run(store, tasks, workers, stored)
        made = commit_objects(store)
        return Measured(first, stage_run(store, tasks, workers, stored), made)
    finally:
        driver.LOOKUP_JOBS, driver.COMMIT_JOBS, driver.PACK_RECORDS = lookups, commits, packed


def tokenize_record(index: int) -> records.TaskRecord:
    """A record shaped like a tokenize task's: two outputs and the summary's seven counts."""
    key = hashlib.sha256(f"part {index}".encode()).hexdigest()
    entries = hashlib.sha256(key.encode()).hexdigest()
    return records.TaskRecord("tokenize", key, {"intermediate": f"sha256:{key}", "entries": f"sha256:{entries}"},
                              {"documents": 1000, "tokens": 8_000_000, "text_bytes": 33_554_432, "bad_records": 0,
                               "special_token_documents": 0, "lines": 1000, "bad_record_examples": []})


def store_packs(store: Store, tasks: int) -> list[str]:
    """Store `tasks` tokenize-shaped records as one plan's packs; the plan's keys."""
    batch = [tokenize_record(index) for index in range(tasks)]
    keys = [record.key for record in batch]
    plan, size = packs.Plan.of("tokenize", keys), driver.PACK_RECORDS
    with ThreadPoolExecutor(driver.LOOKUP_JOBS) as pool:
        list(pool.map(lambda at: packs.write_pack(store, plan, batch[at:at + size]), range(0, tasks, size)))
    return keys


def plan_at_scale(store: Store, tasks: int) -> tuple[Timing, Timing]:
    """Time the lookup a first build of `tasks` makes (none committed), then the one a resume
    makes with every record in packs."""
    keys = [tokenize_record(index).key for index in range(tasks)]
    found: dict[str, records.TaskRecord | None] = {}
    lookup = partial(packs.find_committed, store, "tokenize", keys, driver.LOOKUP_JOBS, driver.PACK_RECORDS, print)
    first = timed(lambda: found.update(lookup()))
    assert len(found) == tasks and not any(found.values())
    store_packs(store, tasks)
    resume = timed(lambda: found.update(lookup()))
    assert len(found) == tasks and all(found.values())
    return first, resume


def serve(latency: float, ports: Any) -> None:
    """moto's server with every answer `latency` seconds late, in a process of its own (so this
    process's CPU is the driver's and its workers'); puts its port on `ports`, then serves."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    assert server._server is not None
    server._server.app = Delayed(server._server.app, latency)
    ports.put(server.get_host_and_port()[1])
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000, help="0 skips the side-by-side runs")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--scale-tasks", type=int, default=600_000)
    parser.add_argument("--store-nothing", action="store_true",
                        help="also run the modes with tasks that store nothing (the driver's own ceiling)")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    server = context.Process(target=serve, args=(args.latency_ms / 1000, ports), daemon=True)
    server.start()
    os.environ.update(s3_env(f"http://127.0.0.1:{ports.get(timeout=60)}"))
    print(f"{args.tasks} tasks, {args.workers} worker threads, {args.latency_ms:g} ms per request, "
          f"LOOKUP_JOBS={driver.LOOKUP_JOBS}, COMMIT_JOBS={driver.COMMIT_JOBS}, PACK_RECORDS={driver.PACK_RECORDS}, "
          f"{os.cpu_count()} cores")
    try:
        if args.tasks:
            side_by_side(args.tasks, args.workers, args.runs, args.store_nothing)
        if args.scale_tasks:
            first, resume = plan_at_scale(new_store("bench-scale"), args.scale_tasks)
            print(f"planning a first build of {args.scale_tasks:,} tasks (none committed): {first.wall:.1f} s wall, "
                  f"{first.cpu:.1f} s CPU")
            print(f"planning {args.scale_tasks:,} tokenize-shaped committed tasks from packs: {resume.wall:.1f} s wall, "
                  f"{resume.cpu:.1f} s CPU ({args.scale_tasks / resume.wall:,.0f} tasks/s)")
    finally:
        server.terminate()


def side_by_side(tasks: int, workers: int, runs: int, store_nothing: bool) -> None:
    """moto's ceiling, then each mode's first build and resume, `runs` times, and the table (again
    with tasks storing nothing when `store_nothing`)."""
    ceiling = bare_puts(new_store("bench-ceiling"), tasks, workers)
    print(f"moto's ceiling: {tasks / ceiling.wall:,.0f} bare PUTs/s from {workers} threads")
    for nothing in (False, True) if store_nothing else (False,):
        rows: dict[str, list[Measured]] = {mode: [] for mode in MODES}
        for run in range(runs):
            for mode in rows:
                rows[mode].append(measure(mode, tasks, workers, run, nothing))
        print("tasks storing nothing (each names one object stored before)" if nothing else "tasks storing one object each")
        report(rows, tasks)


def report(rows: dict[str, list[Measured]], tasks: int) -> None:
    """The table: each mode's best first build and resume, tasks/s and CPU seconds per 1,000
    tasks, and the commit objects of a first build."""
    print(f"{'driver':<14} {'first build tasks/s':>20} {'CPU s/1k tasks':>15} {'commit PUTs':>12} "
          f"{'resume plans/s':>15} {'CPU s/1k tasks':>15}")
    for mode, timings in rows.items():
        first = min(timings, key=lambda timing: timing.first.wall)
        resume = min(timings, key=lambda timing: timing.resume.wall).resume
        print(f"{mode:<14} {tasks / first.first.wall:>20,.0f} {first.first.cpu * 1000 / tasks:>15.2f} "
              f"{first.commits:>12,} {tasks / resume.wall:>15,.0f} {resume.cpu * 1000 / tasks:>15.2f}")
    grouped, serial, single = rows["grouped"][0], rows["one at a time"][0], rows["a PUT a task"][0]
    print(f"first build, grouped / a PUT a task: {single.first.wall / grouped.first.wall:.1f}x the tasks a second; "
          f"grouped / one at a time: {serial.first.wall / grouped.first.wall:.1f}x; "
          f"resume grouped / a PUT a task: {single.resume.wall / grouped.resume.wall:.1f}x")


if __name__ == "__main__":
    main()
