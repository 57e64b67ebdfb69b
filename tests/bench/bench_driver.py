"""Benchmark (not a test): how many tasks a second the build driver plans, runs and commits
against S3 with a round trip's latency on every request (issue 44).

    python -m tests.bench.bench_driver [--tasks 2000] [--latency-ms 20] [--workers 64] [--runs 1]

moto's S3 server on loopback, each request held `--latency-ms` before moto answers it (nearer
real S3 than loopback's fraction of a millisecond; requests overlap, as on S3). A toy stage of
`--tasks` near-empty tasks: each stores one small object (its worker's PUT), and the driver commits
its record. The workers are `--workers` threads of this process (standing in for that many cores
elsewhere: a task costs the driver only its result and its commit). Measured, side by side in one
run, for the driver as built (records packed, `PACK_RECORDS`), for it without packs
(`PACK_RECORDS = 0`: a GET per task on resume) and with its lookups and commits one at a time
and no packs (`LOOKUP_JOBS = COMMIT_JOBS = 1`: the driver before issue 44, less the HEAD before
each GET and the HEAD and GET after each PUT it also made then):

* first build: tasks planned (N lookups, all missing), run and committed per second of wall time;
* resume: the same stage again in a new runner, every record found: tasks planned per second
  (with packs: a LIST a plan anchor and a GET a pack instead of a GET a task);
* CPU seconds per 1,000 tasks of this process: the driver and the worker threads' requests
  (moto serves from a process of its own), so an upper bound on the driver's;
* moto's own ceiling: the same number of bare PUTs from `--workers` threads, no prep;
* planning at scale (`--scale-tasks`, default 600,000; 0 skips it): that many records shaped
  like tokenize tasks' (two outputs, the seven counts of the summary) stored as packs of
  `PACK_RECORDS`, then the lookup a resume of their plan makes (`packs.find_committed`): wall
  and CPU seconds, every record found. The stage's own planning (its task keys) is not in it.
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
    """One near-empty task: store `payload` as an object."""

    store_url: str
    payload: bytes


def run_store_job(job: StoreJob) -> TaskResult:
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
    name: str = "bench"

    def plan(self, previous: None, context: StageContext) -> StagePlan:
        payloads = [f"task {index}".encode() for index in range(self.count)]
        tasks = tuple(Task(context.task_key(self.name, {}, hashlib.sha256(payload).hexdigest()),
                           StoreJob(context.store_url, payload), f"task {index}")
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


def stage_run(store: Store, tasks: int, workers: int) -> Timing:
    runner = Runner(store, ThreadExecutor(workers), Progress(quiet=True), CODE)
    return timed(lambda: runner.run_stage(ManyTasks(tasks), None))


def bare_puts(store: Store, tasks: int, workers: int) -> Timing:
    payloads = [f"bare {index} {time.time_ns()}".encode() for index in range(tasks)]
    with ThreadPoolExecutor(workers) as pool:
        return timed(lambda: list(pool.map(lambda data: cas.put_bytes(store, data), payloads)))


def new_store(name: str) -> S3Store:
    admin_client().create_bucket(Bucket=name)
    return S3Store(f"s3://{name}/store")


MODES = ("one at a time", "no packs", "as built")


def measure(mode: str, tasks: int, workers: int, run: int) -> tuple[Timing, Timing]:
    lookups, commits, packed = driver.LOOKUP_JOBS, driver.COMMIT_JOBS, driver.PACK_RECORDS
    if mode == "one at a time":
        driver.LOOKUP_JOBS = driver.COMMIT_JOBS = 1
    if mode != "as built":
        driver.PACK_RECORDS = 0
    try:
        store = new_store(f"bench-{run}-{mode.replace(' ', '-')}")
        return stage_run(store, tasks, workers), stage_run(store, tasks, workers)
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


def plan_at_scale(store: Store, tasks: int) -> Timing:
    """Time the lookup a resume makes of a plan of `tasks` records, all in packs."""
    keys = store_packs(store, tasks)
    found: dict[str, records.TaskRecord | None] = {}
    timing = timed(lambda: found.update(packs.find_committed(store, "tokenize", keys, driver.LOOKUP_JOBS,
                                                             driver.PACK_RECORDS, print)))
    assert len(found) == tasks and all(found.values())
    return timing


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
            side_by_side(args.tasks, args.workers, args.runs)
        if args.scale_tasks:
            scale = plan_at_scale(new_store("bench-scale"), args.scale_tasks)
            print(f"planning {args.scale_tasks:,} tokenize-shaped committed tasks from packs: {scale.wall:.1f} s wall, "
                  f"{scale.cpu:.1f} s CPU ({args.scale_tasks / scale.wall:,.0f} tasks/s)")
    finally:
        server.terminate()


def side_by_side(tasks: int, workers: int, runs: int) -> None:
    """moto's ceiling, then each mode's first build and resume, `runs` times, and the table."""
    ceiling = bare_puts(new_store("bench-ceiling"), tasks, workers)
    print(f"moto's ceiling: {tasks / ceiling.wall:,.0f} bare PUTs/s from {workers} threads")
    rows: dict[str, list[tuple[Timing, Timing]]] = {mode: [] for mode in MODES}
    for run in range(runs):
        for mode in rows:
            rows[mode].append(measure(mode, tasks, workers, run))
    report(rows, tasks)


def report(rows: dict[str, list[tuple[Timing, Timing]]], tasks: int) -> None:
    """The table: each mode's best first build and resume, tasks/s and CPU seconds per 1,000 tasks."""
    print(f"{'driver':<14} {'first build tasks/s':>20} {'CPU s/1k tasks':>15} {'resume plans/s':>15} "
          f"{'CPU s/1k tasks':>15}")
    for mode, timings in rows.items():
        first = min(timings, key=lambda timing: timing[0].wall)[0]
        resume = min(timings, key=lambda timing: timing[1].wall)[1]
        print(f"{mode:<14} {tasks / first.wall:>20,.0f} {first.cpu * 1000 / tasks:>15.2f} "
              f"{tasks / resume.wall:>15,.0f} {resume.cpu * 1000 / tasks:>15.2f}")
    built, serial, unpacked = rows["as built"][0], rows["one at a time"][0], rows["no packs"][0]
    print(f"ratio as built / one at a time: first build {serial[0].wall / built[0].wall:.1f}x, "
          f"resume {serial[1].wall / built[1].wall:.1f}x")
    print(f"resume with packs / without: {unpacked[1].wall / built[1].wall:.1f}x the tasks planned a second")


if __name__ == "__main__":
    main()
