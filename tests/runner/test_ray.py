"""`prep build --executor ray` on a real local Ray instance (2 CPUs, no dashboard) shared by the module."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.errors import InputError, StoreError, UsageError
from prep.inputs.sources import SourceFile
from prep.progress import Progress
from prep.runner import nearbuckets
from prep.runner.build import build, make_executor
from prep.runner.executors.base import RECYCLE_AFTER
from prep.runner.executors.ray import (
    LocalPath,
    RayExecutor,
    RayNode,
    alive_nodes,
    check_paths_visible,
    local_paths,
)
from prep.runner.executors.rayhead import unreachable_reason
from prep.runner.tokenizing import TokenizeJob
from prep.stages.read import ReadTask
from prep.stages.specs import TokenizeSettings
from prep.storage import open_store
from tests.helpers import committed_records, make_records, prep_env, run_prep, write_jsonl, write_pipeline
from tests.neardup.neardupsupport import chain_drops
from tests.runner.buildsupport import all_objects_intact, build_local

REPO = Path(__file__).resolve().parents[2]
# The tests that need no cluster come first: in a serial run, Ray is then imported (and its
# signal and address paths taken) before the module's cluster starts, as happens under
# pytest-xdist whenever one process gets them first (regression: `ray_address`).

class Stopped(Exception):
    """What the test's own SIGTERM handler raises (the CLI's raises Terminated)."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped()


@pytest.fixture
def own_sigterm() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fake_init(monkeypatch: pytest.MonkeyPatch, *, terminated: bool) -> None:
    """ray.init as it treats signals: its own SIGTERM handler first (sys.exit), maybe a SIGTERM then."""

    ray = pytest.importorskip("ray")

    def init(**_: Any) -> None:
        ray._private.utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))
        if terminated:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at once, in this thread

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)


def test_ray_init_leaves_the_drivers_sigterm_handler_in_place(monkeypatch: pytest.MonkeyPatch,
                                                             own_sigterm: None) -> None:
    """Regression: after ray.init a SIGTERM exited the build at once (exit 1, a native stack dump),
    skipping the driver's cleanup and its one line."""
    _fake_init(monkeypatch, terminated=False)
    RayExecutor(1)
    assert signal.getsignal(signal.SIGTERM) is _stop


def test_a_sigterm_during_ray_init_reaches_the_drivers_handler(monkeypatch: pytest.MonkeyPatch,
                                                              own_sigterm: None) -> None:
    """Regression: one arriving while Ray started was Ray's sys.exit(15): exit 15 and no message."""
    _fake_init(monkeypatch, terminated=True)
    with pytest.raises(Stopped):
        RayExecutor(1)
    assert signal.getsignal(signal.SIGTERM) is _stop


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_address_nothing_listens_at_is_named_before_ray_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: ray.init retried a refused GCS address for ever (a build looked hung)."""
    ray = pytest.importorskip("ray")

    def init(**_: Any) -> None:
        raise AssertionError("ray.init must not be called for an address that refuses connections")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(UsageError, match=rf"cannot reach the Ray cluster at {address}: Connection refused"):
        RayExecutor(1, address=address)


def test_unreachable_reason_probes_host_and_port_and_leaves_other_forms_to_ray() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert unreachable_reason(f"127.0.0.1:{listening.getsockname()[1]}") is None
    closed = _closed_port()
    assert unreachable_reason(f"127.0.0.1:{closed}") == "Connection refused"
    assert unreachable_reason(f"ray://127.0.0.1:{closed}") == "Connection refused"
    assert unreachable_reason("auto") is None and unreachable_reason("local") is None
    assert unreachable_reason("127.0.0.1:\u00b2") is None  # no port: Ray judges it (int() raised before)




RAY_TEST_SETTINGS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_gcs_server_port_wait_time_s": "120"}
"""No usage stats; a GCS that starts while the other test process starts a cluster too (2 cores)
may take over Ray's default 30 s to write its port (seen once), not a failure of prep's."""


def _ray_env(folder: str) -> dict[str, str]:
    """The CLI's environment for a Ray it starts itself: its files under `folder` (short: Ray's
    Unix socket paths must stay under 107 bytes), no usage stats, no address or token settings."""
    env = {name: value for name, value in prep_env(RAY_TMPDIR=folder, HOME=folder, **RAY_TEST_SETTINGS).items()
           if name not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    return env


def test_a_cli_ray_build_says_it_starts_ray_and_prints_none_of_rays_log_lines(tmp_path: Path, tokenizer_path: Path) -> None:
    """Regression: Ray's start-up (about 13 s) showed nothing, then Ray's own token-authentication
    WARNING line landed among prep's progress."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(20, seed=4))
    pipeline = write_pipeline(tmp_path, tokenizer_path)
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        result = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "2", "--executor", "ray",
                          "--json", env=_ray_env(folder), cwd=REPO, timeout=300)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = json.loads(result.stdout)  # exactly one JSON document
    assert report["schema"] == "prep.build-report/1" and report["snapshot"].startswith("sha256:")
    lines = result.stderr.splitlines()
    assert lines[0] == "starting Ray (a local instance) ...", result.stderr
    others = [line for line in lines[1:] if not re.match(r"\[ *\d+\.\ds\] ", line)]
    assert others == [], result.stderr  # progress lines only: no Ray warning, no worker output


def test_quiet_silences_the_ray_start_line(tmp_path: Path, tokenizer_path: Path) -> None:
    """The line saying Ray is being reached is progress: -q silences it (here before any Ray starts)."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(5, seed=4))
    pipeline = write_pipeline(tmp_path, tokenizer_path)
    address = f"127.0.0.1:{_closed_port()}"
    args = ("build", pipeline, "--store", tmp_path / "store", "--executor", "ray", "--ray-address", address)
    loud = run_prep(*args, check=False, timeout=120)
    assert loud.returncode == 2 and loud.stderr.startswith(f"connecting to the Ray cluster at {address} ...\nprep: error: ")
    quiet = run_prep(*args, "-q", check=False, timeout=120)
    assert quiet.returncode == 2 and quiet.stderr == loud.stderr.split("\n", 1)[1]


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """One local Ray instance for the module; its files (and ~/.ray) live in a short /tmp folder
    because Ray's Unix socket paths must stay under 107 bytes. Authentication is left to ray.init
    (no RAY_AUTH_MODE): Ray reads that variable when first imported, and a test that imported it
    earlier in the same process left a driver without the token its new cluster then demanded."""
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    patch = pytest.MonkeyPatch()
    for name, value in {"RAY_TMPDIR": folder, "HOME": folder, **RAY_TEST_SETTINGS}.items():
        patch.setenv(name, value)
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        patch.delenv(name, raising=False)
    patch.chdir(REPO)  # Ray puts the driver's working directory on workers' sys.path (for tests.*)
    try:
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 << 20,
                 logging_level=logging.WARNING)
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()
        patch.undo()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    """A pipeline over three small files (three tokenize tasks) with exact duplicates."""
    folder = tmp_path_factory.mktemp("raycorpus")
    first = make_records(40, seed=1, prefix="a")
    write_jsonl(folder / "corpus" / "a.jsonl", first)
    write_jsonl(folder / "corpus" / "b.jsonl", make_records(30, seed=2, prefix="b"))
    write_jsonl(folder / "corpus" / "c.jsonl", make_records(20, seed=3, prefix="c") + first[:3])
    return write_pipeline(folder, tokenizer_path, ["corpus"])


@pytest.fixture(scope="module")
def reference(corpus: Path) -> tuple[str, Path]:
    """The snapshot id and store of the same pipeline built with the local executor."""
    store = corpus.parent / "local-store"
    result = run_prep("build", corpus, "--store", store, "--workers", "2")
    return result.stdout.strip(), store


def object_keys(store: Path) -> set[str]:
    return {p.relative_to(store).as_posix() for p in (store / "objects").rglob("*") if p.is_file()}


def test_cli_ray_build_matches_local_executor(ray_address: str, corpus: Path, reference: tuple[str, Path],
                                              tmp_path: Path) -> None:
    snapshot_id, local_store = reference
    result = run_prep("build", corpus, "--store", tmp_path / "store", "--workers", "2",
                      "--executor", "ray", "--ray-address", ray_address)
    assert result.stdout.strip() == snapshot_id
    assert object_keys(tmp_path / "store") == object_keys(local_store)


def test_ray_runs_merge_tasks_to_the_snapshot_of_an_unmerged_local_build(ray_address: str, corpus: Path,
                                                                          reference: tuple[str, Path],
                                                                          tmp_path: Path) -> None:
    """Three parts merged in pairs on Ray (two merges in two rounds): the local unmerged snapshot."""
    snapshot_id, _ = reference
    merged = corpus.with_name("merged.toml")
    merged.write_text(corpus.read_text() + "\n[build]\nmerge_fan_in = 2\n")
    result = run_prep("build", merged, "--store", tmp_path / "store", "--workers", "2",
                      "--executor", "ray", "--ray-address", ray_address)
    assert result.stdout.strip() == snapshot_id
    assert "merge: done" in result.stderr
    assert len(committed_records(open_store(tmp_path / "store"), "merge")) == 1


def test_worker_killed_mid_task_is_retried_to_the_same_snapshot(ray_address: str, corpus: Path,
                                                                reference: tuple[str, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "crashed"
    monkeypatch.setenv("PREP_CRASH_AT", "tokenize.after_output:1:self")
    monkeypatch.setenv("PREP_CRASH_ONCE", str(marker))
    store = open_store(tmp_path / "store")
    executor = RayExecutor(2, verify_paths=True)
    try:
        result = build(load_pipeline(corpus), store, executor, progress=Progress(quiet=True))
    finally:
        executor.close()
    assert marker.exists(), "no worker reached the crash point"
    snapshot_id, local_store = reference
    assert result.snapshot.id == snapshot_id
    assert result.stages["tokenize"].ran == 3
    assert len(committed_records(store, "tokenize")) == 3
    assert object_keys(tmp_path / "store") == object_keys(local_store)
    [seen] = executor.visible_paths.values()  # the one node was probed for every local path
    pipeline = load_pipeline(corpus)
    inputs = {str(path) for path in (corpus.parent / "corpus").glob("*.jsonl")}
    assert seen == {str(tmp_path / "store"), str(pipeline.tokenizer_path()), *inputs}


def test_near_dup_chains_on_ray_match_the_local_build_on_one_two_and_three_workers(
        ray_address: str, tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42 on Ray: the chain corpus's signatures, band buckets (eight) and clusters as Ray
    tasks give the local executor's snapshot, objects and drops (each chain one cluster keeping
    its first link) on 1, 2 and 3 workers, though a worker is killed (kill -9) after storing the
    drops (1 worker), a part's bands (2) or a bucket's pairs (3): Ray's retry changes nothing."""
    from tests.runner.test_neardup_build import BAND_RECORDS, CHAINS, drops_of, sizes_of, write_chains

    pipeline, files, chains = write_chains(tmp_path, tokenizer_path)
    sizes = sizes_of(files[:len(CHAINS)])
    expected = chain_drops(chains, sum(sizes))
    monkeypatch.setattr(nearbuckets, "RECORDS_PER_BUCKET", BAND_RECORDS)
    local = build_local(pipeline, tmp_path / "local", 2)
    assert drops_of(tmp_path / "local", local, sizes) == expected
    crashes = {1: "near_clusters.after_write:1:self", 2: "tokenize.after_output:1:self",
               3: "near_buckets.after_write:1:self"}
    for workers, point in crashes.items():
        monkeypatch.setenv("PREP_CRASH_AT", point)
        monkeypatch.setenv("PREP_CRASH_ONCE", str(tmp_path / f"crashed-{workers}"))
        store = tmp_path / f"ray-{workers}"
        executor = RayExecutor(workers, verify_paths=True)  # the near-dup jobs' paths probed too
        try:
            result = build(load_pipeline(pipeline), open_store(store), executor, progress=Progress(quiet=True))
        finally:
            executor.close()
        assert result.snapshot.id == local.snapshot.id and result.stages["near_buckets"].ran == 8
        assert drops_of(store, result, sizes) == expected
        assert object_keys(store) == object_keys(tmp_path / "local") and all_objects_intact(store)
        assert (tmp_path / f"crashed-{workers}").exists(), f"no worker reached {point}"


@dataclass(frozen=True)
class Failing:
    attempts: str
    message: str


def fail_with_input_error(job: Failing) -> None:
    with open(job.attempts, "a") as log:
        log.write("attempt\n")
    raise InputError(job.message)


def square(value: int) -> int:
    return value * value


def test_prep_error_in_a_task_surfaces_as_itself_and_is_not_retried(ray_address: str, tmp_path: Path) -> None:
    attempts = tmp_path / "attempts"
    executor = RayExecutor(2)
    with pytest.raises(InputError) as raised:
        list(executor.run(fail_with_input_error, [Failing(str(attempts), "corpus.jsonl:3: not JSON")]))
    assert type(raised.value) is InputError
    assert str(raised.value) == "corpus.jsonl:3: not JSON"
    assert attempts.read_text() == "attempt\n"


class PathError(StoreError):
    """A prep error built from more than its message, with no __reduce__: it cannot be unpickled."""

    exit_code = 4

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")


def fail_with_path_error(_: int) -> None:
    raise PathError("/store/objects/ab", "No space left on device")


def test_a_prep_error_ray_cannot_rebuild_arrives_as_its_message_and_exit_code(ray_address: str) -> None:
    """Regression: it came back as "Ray task failed after 3 retries: UnserializableException",
    though nothing was retried and the task had named its error."""
    executor = RayExecutor(1)
    with pytest.raises(StoreError) as raised:
        list(executor.run(fail_with_path_error, [0]))
    assert str(raised.value) == "/store/objects/ab: No space left on device"
    assert raised.value.exit_code == 4


def test_results_arrive_once_per_item_with_their_index(ray_address: str) -> None:
    executor = RayExecutor(1)
    assert sorted(executor.run(square, list(range(7)))) == [(i, i * i) for i in range(7)]
    executor.close()
    import ray

    assert ray.is_initialized(), "an executor must not shut down a Ray it did not start"


def worker_pid(value: int) -> int:
    return os.getpid()


def test_a_ray_worker_process_runs_at_most_recycle_after_tasks(ray_address: str) -> None:
    """As in the local pool, a worker's heap must not grow with the corpus: Ray replaces a
    process after RECYCLE_AFTER calls."""
    executor = RayExecutor(2)
    pids = [pid for _, pid in executor.run(worker_pid, list(range(3 * RECYCLE_AFTER)))]
    executor.close()
    assert max(pids.count(pid) for pid in set(pids)) <= RECYCLE_AFTER and len(set(pids)) >= 3


def test_cli_prints_one_line_error_for_a_bad_record(ray_address: str, tmp_path: Path, tokenizer_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "bad.jsonl").write_text('{"id": "1", "text": "fine"}\n{not json\n')
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    result = run_prep("build", pipeline, "--store", tmp_path / "store", "--executor", "ray",
                      "--ray-address", ray_address, "--workers", "1", check=False)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("prep: error: ") and "bad.jsonl" in last
    assert "Traceback" not in result.stderr and "RayTaskError" not in result.stderr


def _tokenize_job(store_url: str, location: str, tokenizer: str) -> TokenizeJob:
    source = SourceFile(location, "a.jsonl", 10, "jsonl", "0" * 64)
    settings = TokenizeSettings(tokenizer, "0" * 64, "<|endoftext|>", False, "tokenizers", "fail")
    return TokenizeJob(store_url, ReadTask(source, 0, 0, 10, "text", "id"), settings)


def test_local_paths_names_store_inputs_and_tokenizer_but_not_s3(tmp_path: Path, tokenizer_path: Path) -> None:
    data = write_jsonl(tmp_path / "a.jsonl", make_records(2))
    jobs = [_tokenize_job(str(tmp_path), str(data), str(tokenizer_path)),
            _tokenize_job("s3://bucket/store", "s3://bucket/a.jsonl", str(tmp_path / "gone.json"))]
    assert local_paths(jobs) == {LocalPath(str(tmp_path), "store"), LocalPath(str(data), "input"),
                                 LocalPath(str(tokenizer_path), "input")}


def test_every_node_is_asked_and_a_missing_path_is_named(ray_address: str, tmp_path: Path) -> None:
    nodes = alive_nodes()
    assert nodes
    check_paths_visible([LocalPath(str(tmp_path), "store")], nodes)
    with pytest.raises(InputError, match=rf"^{tmp_path}/gone\.jsonl: not visible on Ray node {nodes[0].address} "):
        check_paths_visible([LocalPath(str(tmp_path / "gone.jsonl"), "input")], nodes)
    with pytest.raises(StoreError, match="s3://"):
        check_paths_visible([LocalPath(str(tmp_path / "nostore"), "store")], nodes)


def test_a_node_that_died_since_it_was_listed_is_not_probed(ray_address: str, tmp_path: Path) -> None:
    """Issue 44: a probe pinned to a node gone since `alive_nodes` listed it was a
    TaskUnschedulableError traceback (exit 1); the node is skipped, as no task runs there."""
    gone = RayNode("ab" * 28, "192.0.2.99")
    check_paths_visible([LocalPath(str(tmp_path), "store")], [gone, *alive_nodes()])
    with pytest.raises(InputError, match="gone.jsonl: not visible on Ray node"):
        check_paths_visible([LocalPath(str(tmp_path / "gone.jsonl"), "input")], [gone, *alive_nodes()])


def test_missing_ray_is_a_usage_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(UsageError, match=r"pip install 'prep\[ray\]'"):
        make_executor("ray", 2)


def test_crash_once_kills_only_the_first_process_to_reach_the_point(tmp_path: Path) -> None:
    marker = tmp_path / "crashed"
    env = {**os.environ, "PREP_CRASH_AT": "here:2:self", "PREP_CRASH_ONCE": str(marker)}
    code = "from prep.faults import crash_point\ncrash_point('here')\nprint('first')\ncrash_point('here')\nprint('second')"

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                              start_new_session=True, timeout=60)

    died = run()
    assert died.returncode == -9 and died.stdout == "first\n" and marker.exists()
    survived = run()
    assert survived.returncode == 0 and survived.stdout == "first\nsecond\n"


# A second driver on the module's cluster whose job gives every worker a modified copy of prep
# first on PYTHONPATH (a node running other code); the driver itself runs this checkout.
FOREIGN_DRIVER = """
import logging, sys
import ray
ray.init(address=sys.argv[1], runtime_env={"env_vars": {"PYTHONPATH": sys.argv[2]}}, logging_level=logging.WARNING)
from prep.cli.main import main
sys.argv = ["prep", *sys.argv[3:]]
main()
"""


@pytest.mark.parametrize("modified", [True, False])
def test_a_ray_worker_running_other_code_refuses_its_tasks(ray_address: str, corpus: Path, tmp_path: Path,
                                                           modified: bool) -> None:
    """With the copy changed, every task is refused (exit 5, nothing committed); the unchanged copy
    (the same code from another path) builds, so the refusal is the code's doing, not the set-up's."""
    from tests.runner.test_code_identity import FOREIGN_EXIT, package_copy

    copy = package_copy(tmp_path / "copy")
    if modified:
        shard = copy / "prep" / "stages" / "shard.py"
        shard.write_text(shard.read_text() + "\n# another version of the code on this node\n")
    store = tmp_path / "store"
    ran = subprocess.run([sys.executable, "-c", FOREIGN_DRIVER, ray_address, str(copy), "build", str(corpus),
                          "--store", str(store), "--executor", "ray", "--workers", "2"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300, env=prep_env())
    if not modified:
        assert ran.returncode == 0, ran.stderr
        assert (store / "refs" / "tiny" / "latest.json").exists()
        return
    last = ran.stderr.strip().splitlines()[-1]
    assert ran.returncode == FOREIGN_EXIT, ran.stderr
    assert last.startswith("prep: error: worker on host ") and "refuses the task" in last, ran.stderr
    assert not (store / "refs").exists() and not list(store.glob("tasks/*/*.json")) and not list(store.glob("packs/*/*/*.json"))
