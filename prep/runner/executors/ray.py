"""Run build tasks on a Ray cluster (`prep build --executor ray`).

Each task asks Ray for one CPU and runs the same module-level task function the local pool runs;
workers open the store themselves, so only small job descriptions and results cross the network.
A worker that dies mid-task is retried by Ray (outputs are content-addressed and create-only, so a
second run writes nothing new); errors raised by the task itself are never retried.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from prep.errors import ExecutorError, InputError, PrepError, StoreError, UsageError
from prep.runner.executors.base import RECYCLE_AFTER, WarmUp, release_free_memory, transportable
from prep.runner.executors.rayhead import CHECK_EVERY, HeadWatch, exit_if_stuck, outlast_ray_reconnect, unreachable_reason

# Environment a task runs with: one tokenizer thread per task (each task holds one Ray CPU), plus
# the crash-injection switches that tests set on the driver (see prep/faults.py).
TASK_THREADS_ENV = {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
FORWARDED_ENV = ("PREP_CRASH_AT", "PREP_CRASH_ONCE")
DEFAULT_MAX_RETRIES = 3
T = TypeVar("T")


def import_ray() -> ModuleType:
    """The `ray` module, or a UsageError saying how to install the optional extra."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'prep[ray]'") from None
    return ray


def task_environment() -> dict[str, str]:
    """Variables every task sets while it runs: thread caps and forwarded PREP_CRASH_* switches."""
    forwarded = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    return {**TASK_THREADS_ENV, **forwarded}


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` for the duration of one task, then restore the worker's own values."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_task(fn: Callable[[Any], Any], item: Any, env: Mapping[str, str]) -> Any:
    """What a Ray worker runs: the task function under the task environment."""
    try:
        with _environment(env):
            return fn(item)
    except Exception as exc:
        # Hazard: one Ray cannot rebuild on the driver comes back as UnserializableException,
        # which names neither the task's error nor its exit code.
        raise transportable(exc) from None
    finally:
        release_free_memory()


# -- local paths must be visible on every node ----------------------------------------------------
@dataclass(frozen=True)
class LocalPath:
    """An absolute path a task will open: the store root ("store") or an input/tokenizer file."""

    path: str
    role: str


def local_paths(items: Sequence[Any]) -> set[LocalPath]:
    """Every absolute path that exists on the driver and appears in the jobs' (nested) fields."""
    found: set[LocalPath] = set()
    seen: set[str] = set()

    def visit(value: Any, field: str) -> None:
        if isinstance(value, str):
            if value.startswith("/") and value not in seen:
                seen.add(value)
                if os.path.exists(value):
                    found.add(LocalPath(value, "store" if field == "store_url" else "input"))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for member in dataclasses.fields(value):
                visit(getattr(value, member.name), member.name)
        elif isinstance(value, (tuple, list)):
            for element in value:
                visit(element, field)

    for item in items:
        visit(item, "")
    return found


def _missing_paths(paths: list[str]) -> list[str]:
    """Runs on one node: the paths that do not exist there."""
    return [path for path in paths if not os.path.exists(path)]


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str


def alive_nodes() -> list[RayNode]:
    """The cluster's live nodes, in a stable order."""
    ray = import_ray()
    return sorted((RayNode(n["NodeID"], n["NodeManagerAddress"]) for n in ray.nodes() if n["Alive"]),
                  key=lambda node: node.node_id)


def check_paths_visible(paths: Sequence[LocalPath], nodes: Sequence[RayNode]) -> None:
    """Raise StoreError/InputError naming the first path some node cannot see (one probe per node)."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not paths:
        return
    probe = ray.remote(_missing_paths)
    names = sorted(p.path for p in paths)
    refs = [probe.options(num_cpus=0, max_retries=DEFAULT_MAX_RETRIES,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote(names)
            for node in nodes]
    roles = {p.path: p.role for p in paths}
    for node, ref in zip(nodes, refs):
        try:
            missing = ray.get(ref)
        except ray.exceptions.TaskUnschedulableError:
            continue  # the node died since it was listed: no task of this build runs there
        if missing:
            first = missing[0]
            error = StoreError if roles[first] == "store" else InputError
            raise error(f"{first}: not visible on Ray node {node.address} ({len(missing)} of {len(names)} local "
                        "paths missing there); on a multi-node cluster the store and inputs must be on a "
                        "filesystem every node mounts at the same path, or on s3://")


# -- the executor ---------------------------------------------------------------------------------
class RayExecutor:
    """Runs tasks on Ray with at most `workers` in flight, each holding one CPU.

    Connects to `address` (or $RAY_ADDRESS); without either starts a local instance with every
    core and no dashboard (Ray keeps its files under $RAY_TMPDIR, default /tmp). A Ray already
    initialised in this process is reused and left running by `close()`. `verify_paths` (default:
    only on a cluster of several nodes or through Ray Client) probes every node for the local
    paths the jobs name; `visible_paths` records, per node id, the paths found there. The head's
    GCS is watched (rayhead.HeadWatch): once it is lost, the build stops with ClusterLostError."""

    shares_filesystem = False  # nodes need not see this machine's staging files
    backend = "ray"

    def __init__(self, workers: int, address: str | None = None, *,
                 max_retries: int = DEFAULT_MAX_RETRIES, verify_paths: bool | None = None) -> None:
        self.workers = workers
        self.max_retries = max_retries
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self._ray = import_ray()
        self._owns_ray = not self._ray.is_initialized()
        if self._owns_ray:
            self._connect()
        # A worker process is replaced after RECYCLE_AFTER tasks, as in the local pool (its heap
        # grows with the tasks it ran); Ray takes max_calls only here, not in .options().
        self._remote = self._ray.remote(max_calls=RECYCLE_AFTER)(_run_task).options(
            num_cpus=1, max_retries=max_retries, retry_exceptions=False)
        self.verify_paths = verify_paths
        self.visible_paths: dict[str, set[str]] = {}
        self._watch = self._watch_head()

    def _watch_head(self) -> HeadWatch | None:
        """A watch on the head's GCS, at the address the user gave if it names one (else Ray's);
        none through Ray Client, whose driver is the server."""
        if (self.address or "").startswith("ray://") or not self._ray.is_initialized():
            return None
        given = self.address if self.address and ":" in self.address else None
        return HeadWatch(given or str(self._ray.get_runtime_context().gcs_address))

    def _connect(self) -> None:
        """Start or reach Ray, keeping the driver's own SIGTERM handler."""
        # Hazard: ray.init replaces the driver's SIGTERM handler (with sys.exit(15), then a native
        # one that dumps a stack and exits 1): a build stopped by a scheduler, during the init or
        # after it, would exit without its one line and its cleanup.
        main = threading.current_thread() is threading.main_thread()
        on_sigterm = signal.getsignal(signal.SIGTERM) if main else None
        terminated = False
        try:
            self._init_ray()
        except SystemExit as exc:
            if on_sigterm is None or exc.code != signal.SIGTERM:
                raise
            terminated = True  # Ray's handler took a SIGTERM meant for the driver
        finally:
            if on_sigterm is not None:
                signal.signal(signal.SIGTERM, on_sigterm)
        if terminated:
            signal.raise_signal(signal.SIGTERM)

    def _init_ray(self) -> None:
        unreachable = self.address and unreachable_reason(self.address)
        if unreachable:
            raise UsageError(f"--executor ray: cannot reach the Ray cluster at {self.address}: {unreachable}")
        # Ray's own log lines (its token-authentication warning, workers' output) stay out of
        # prep's stderr: errors reach the driver as exceptions, named in prep's one line.
        quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
        if not (self.address or "").startswith("ray://"):
            outlast_ray_reconnect()
        try:
            if self.address:
                # Ray Client (ray://) passes init arguments on to the server; keep them minimal there.
                self._ray.init(address=self.address, **({} if self.address.startswith("ray://") else quiet))
            else:
                self._ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--executor ray: cannot start or reach {where}: {reason}") from None

    def _check_local_paths(self, items: Sequence[Any]) -> None:
        """On a cluster of several hosts, make sure every node sees the local paths the jobs name."""
        nodes = self._watched(alive_nodes)
        verify = self.verify_paths
        if verify is None:
            verify = len(nodes) > 1 or (self.address or "").startswith("ray://")
        if not verify:
            return
        paths = local_paths(items)
        names = {p.path for p in paths}
        unchecked = [node for node in nodes if not names <= self.visible_paths.get(node.node_id, set())]
        self._watched(lambda: check_paths_visible(sorted(paths, key=lambda p: p.path), unchecked))
        for node in unchecked:
            self.visible_paths.setdefault(node.node_id, set()).update(names)

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        """Yield (index, fn(items[index])) as tasks complete; the first error is raised after
        cancelling the rest, a PrepError as itself (not wrapped in Ray's RayTaskError)."""
        self._check_local_paths(items)
        env = task_environment()
        queue = deque(enumerate(items))
        pending: dict[Any, int] = {}  # ObjectRef -> item index
        try:
            while queue or pending:
                self._top_up(fn, env, queue, pending)
                ready, _ = self._ray.wait(list(pending), num_returns=1, timeout=CHECK_EVERY)
                for ref in ready:
                    index = pending.pop(ref)
                    result = self._result(ref)
                    self._top_up(fn, env, queue, pending)  # the free slot's next task runs while the driver commits
                    yield index, result
                if self._watch is not None:  # a result that arrived is committed first, then the build stops
                    self._watch.check()
        finally:
            for ref in pending:
                self._ray.cancel(ref)

    def _top_up(self, fn: Callable[[Any], Any], env: dict[str, str], queue: deque[tuple[int, Any]],
                pending: dict[Any, int]) -> None:
        """Submit queued tasks until `workers` are in flight."""
        while queue and len(pending) < self.workers:
            index, item = queue.popleft()
            pending[self._remote.remote(fn, item, env)] = index

    def _result(self, ref: Any) -> Any:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, PrepError):
                raise exc.cause from None
            raise
        except self._ray.exceptions.RayError as exc:
            lost = self._watch.confirm_lost() if self._watch is not None else None
            if lost is not None:
                raise lost from None  # the task failed because the head is gone
            first = (str(exc).strip().splitlines() or [""])[0]
            retried = isinstance(exc, self._retried_errors())
            after = f" after {self.max_retries} retries" if retried else ""
            raise ExecutorError(f"Ray task failed{after}: {type(exc).__name__}: {first}") from None

    def _retried_errors(self) -> tuple[type[BaseException], ...]:
        """The failures Ray retries a task after (its process or node died), not its own errors."""
        errors = self._ray.exceptions
        return (errors.WorkerCrashedError, errors.OutOfMemoryError, errors.NodeDiedError)

    def warm(self, warm_up: WarmUp) -> None:
        """Nothing to do: Ray workers load the tokenizer with their first tokenize task."""

    def _watched(self, call: Callable[[], T]) -> T:
        """call() (which asks the head) given up with ClusterLostError if the head is lost meanwhile."""
        return self._watch.call(call) if self._watch is not None else call()

    def close(self) -> None:
        """Disconnect from (or stop) the Ray this executor started; a borrowed one keeps running.
        Once the head is lost, a disconnect that hangs ends the process after CLOSE_GRACE seconds."""
        if self._watch is not None:
            self._watch.stop()
        with exit_if_stuck(self._watch.lost if self._watch is not None else None):
            if self._owns_ray and self._ray.is_initialized():
                self._ray.shutdown()
