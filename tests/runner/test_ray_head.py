"""Issue 44: the head of a three-raylet Ray cluster (its GCS) killed in the middle of a
`prep build --executor ray` reading its corpus from and writing its store to S3 (moto's server
over HTTP): one error line, exit 75, only the error JSON on stdout, within a bounded time; then the
same build on a new cluster ends at the local executor's snapshot and runs only the tasks the lost
build had not committed."""

from __future__ import annotations

import hashlib
import json
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from prep.errors import ClusterLostError
from prep.manifest.schema import validate
from prep.runner.executors.rayhead import HeadWatch
from prep.storage import open_store
from tests.helpers import committed_records, make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.test_ray import REPO, _closed_port, _ray_env, object_keys
from tests.s3support import admin_client, new_bucket

FILES = 12  # tokenize tasks: enough that some are uncommitted when the first commit lands


@dataclass(frozen=True)
class Node:
    """One raylet started by `ray start --block` in a session of its own (killpg ends all of it)."""

    process: subprocess.Popen[str]

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def start_node(folder: str, *args: str) -> Node:
    """`ray start --block` with its files and HOME in `folder` (see `ready`)."""
    ray = Path(sys.executable).with_name("ray")
    process = subprocess.Popen([str(ray), "start", "--block", "--disable-usage-stats", f"--temp-dir={folder}", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=_ray_env(folder), cwd=REPO, start_new_session=True)
    return Node(process)


def ready(node: Node) -> None:
    """Return once the node's `ray start` says Ray runs there (it writes nothing more then)."""
    assert node.process.stdout is not None
    seen = []
    for line in node.process.stdout:
        seen.append(line)
        if "Ray runtime started" in line:
            return
    raise AssertionError("ray start did not start a node:\n" + "".join(seen))


@dataclass(frozen=True)
class Cluster:
    """A head and its other raylets, all on this machine; `address` is the head's GCS."""

    address: str
    nodes: list[Node]


class Clusters:
    """Starts clusters (each node's files and HOME in a folder of its own) and kills them all at the end."""

    def __init__(self) -> None:
        self.started: list[Node] = []
        self.folders: list[str] = []

    def folder(self) -> str:
        self.folders.append(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths < 108 bytes
        return self.folders[-1]

    def launch(self, raylets: int, cpus: int = 1) -> Cluster:
        """A head, then its other raylets all at once; returns when every node runs."""
        port = _closed_port()
        head = self.start(f"--num-cpus={cpus}", "--head", f"--port={port}", "--include-dashboard=false")
        ready(head)
        others = [self.start(f"--num-cpus={cpus}", f"--address=127.0.0.1:{port}") for _ in range(raylets - 1)]
        for node in others:
            ready(node)
        return Cluster(f"127.0.0.1:{port}", [head, *others])

    def start(self, *args: str) -> Node:
        node = start_node(self.folder(), *args)
        self.started.append(node)
        return node

    def close(self) -> None:
        for node in self.started:
            node.kill()
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def clusters() -> Iterator[Clusters]:
    pytest.importorskip("ray")
    made = Clusters()
    try:
        yield made
    finally:
        made.close()


PROGRESS = re.compile(r"\[ *\d+\.\ds\] ")


def s3_keys(url: str, prefix: str) -> list[str]:
    """Every key below `prefix` of the store at `s3://bucket/root`, relative to the store,
    listed through boto3 on the test endpoint."""
    bucket, _, root = url.removeprefix("s3://").partition("/")
    pages = admin_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/{prefix}")
    return [item["Key"].removeprefix(f"{root}/") for page in pages for item in page.get("Contents", [])]


def committed_tokenize_tasks(store: str) -> int:
    """How many tokenize task records the S3 store holds (single or in packs)."""
    return len(committed_records(open_store(store), "tokenize"))


def all_s3_objects_intact(store: str) -> bool:
    """Every object under the store's objects/ hashes to its key's name."""
    bucket, _, root = store.removeprefix("s3://").partition("/")
    for key in s3_keys(store, "objects/"):
        body = admin_client().get_object(Bucket=bucket, Key=f"{root}/{key}")["Body"].read()
        if hashlib.sha256(body).hexdigest() != key.rpartition("/")[2]:
            return False
    return True


def wait_for_commits(store: str, build: subprocess.Popen[str], timeout: float = 120.0) -> None:
    """Return once the build committed its first tokenize task to the S3 store (it still runs)."""
    deadline = time.monotonic() + timeout
    while not committed_tokenize_tasks(store):
        assert build.poll() is None, f"the build ended before its first commit: {build.communicate()}"
        assert time.monotonic() < deadline, "no tokenize task committed"
        time.sleep(0.05)


def s3_corpus(corpus: Path) -> str:
    """A fresh bucket holding `corpus`'s files under corpus/; returns the s3:// URL of that prefix."""
    url = new_bucket()
    for path in sorted(corpus.iterdir()):
        admin_client().put_object(Bucket=url.removeprefix("s3://"), Key=f"corpus/{path.name}", Body=path.read_bytes())
    return f"{url}/corpus/"


@pytest.mark.usefixtures("s3_endpoint")  # before the clusters start: the raylets' workers read and write S3
def test_losing_the_head_mid_build_is_one_line_and_a_new_cluster_resumes(clusters: Clusters, tmp_path: Path,
                                                                          tokenizer_path: Path) -> None:
    for index in range(FILES):
        write_jsonl(tmp_path / "corpus" / f"{index:02d}.jsonl", make_records(300, seed=index, prefix=f"f{index}"))
    reference = run_prep("build", write_pipeline(tmp_path, tokenizer_path, ["corpus"]), "--store", tmp_path / "local",
                         "--workers", "2").stdout.strip()
    (tmp_path / "remote").mkdir()
    pipeline = write_pipeline(tmp_path / "remote", tokenizer_path, [s3_corpus(tmp_path / "corpus")])
    store = f"{new_bucket()}/store"
    first = clusters.launch(3)
    # One task at a time: the head dies with tasks left to run. With three at a time these tiny
    # tasks all finished (and committed) before the kill could follow the first commit (CI, flaky).
    build = subprocess.Popen([sys.executable, "-m", "prep.cli.main", "build", str(pipeline), "--store", store,
                              "--executor", "ray", "--ray-address", first.address, "--workers", "1", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env=_ray_env(clusters.folder()), start_new_session=True)
    try:
        wait_for_commits(store, build)
        killed = time.monotonic()
        first.nodes[0].kill()  # the head: its GCS, its raylet (the driver's) and its workers
        with ThreadPoolExecutor(1) as starting:  # the next cluster starts while the build stops
            second = starting.submit(clusters.launch, 1, 2)
            stdout, stderr = build.communicate(timeout=120)
            took = time.monotonic() - killed
            second.result()
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
    assert build.returncode == ClusterLostError.exit_code == 75, stderr
    lines = stderr.splitlines()
    assert re.fullmatch(rf"prep: error: lost the Ray cluster's head at {re.escape(first.address)}: .*; "
                        "committed work is kept, rerun to resume", lines[-1]), stderr
    assert lines[0] == f"connecting to the Ray cluster at {first.address} ...", stderr
    assert [line for line in lines[1:-1] if not PROGRESS.match(line)] == [], stderr  # no Ray line, no traceback
    assert took < 30, f"the build took {took:.1f} s to stop after the head died"
    error = json.loads(stdout)  # exactly one JSON document
    validate(error, "prep.error/1")
    assert error == {"schema": "prep.error/1", "error": lines[-1].removeprefix("prep: error: "), "exit_code": 75,
                     "kind": "cluster_lost"}
    committed = committed_tokenize_tasks(store)
    assert 1 <= committed < FILES and s3_keys(store, "refs/") == []

    rerun = run_prep("build", pipeline, "--store", store, "--executor", "ray", "--ray-address", second.result().address,
                     "--workers", "2", "--json", env=_ray_env(clusters.folder()), cwd=REPO)
    report = json.loads(rerun.stdout)
    assert report["snapshot"] == reference
    [tokenize] = [stage for stage in report["stages"] if stage["name"] == "tokenize"]
    assert (tokenize["ran"], tokenize["cached"]) == (FILES - committed, committed)
    assert set(s3_keys(store, "objects/")) == object_keys(tmp_path / "local") and all_s3_objects_intact(store)


def _listening() -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_a_head_that_refuses_connections_stops_a_call_waiting_on_it() -> None:
    """A call blocked on the head (ray.nodes() on a dead GCS waits for Ray's own timeout) is left
    behind with ClusterLostError once the head has refused connections for `lost_after` seconds."""
    server = _listening()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    watch = HeadWatch(address, lost_after=2.0)
    try:
        assert watch.call(lambda: 7) == 7
        time.sleep(1.5)
        watch.check()  # it answers: nothing to raise
        server.close()
        started = time.monotonic()
        with pytest.raises(ClusterLostError) as raised:
            watch.call(lambda: time.sleep(60))
        assert time.monotonic() - started < 10
    finally:
        watch.stop()
    assert str(raised.value).startswith(f"lost the Ray cluster's head at {address}: "
                                        "its GCS has not answered for 2 s (Connection refused)")
    assert str(raised.value).endswith("; committed work is kept, rerun to resume") and raised.value.exit_code == 75


def test_a_head_that_answers_again_in_time_is_not_lost() -> None:
    """A GCS that restarts (Ray's GCS fault tolerance) within `lost_after` keeps the build going."""
    server = _listening()
    port = server.getsockname()[1]
    watch = HeadWatch(f"127.0.0.1:{port}", lost_after=4.0)
    try:
        server.close()
        time.sleep(1.5)
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))
            again.listen()
            time.sleep(5)
            watch.check()
            assert watch.lost is None and watch.confirm_lost() is None
    finally:
        watch.stop()


STUCK = """
import sys, time
from prep.errors import ClusterLostError
from prep.runner.executors.rayhead import exit_if_stuck
with exit_if_stuck(ClusterLostError("lost the head"), grace=float(sys.argv[1])):
    time.sleep(float(sys.argv[2]))
print("closed")
"""


@pytest.mark.parametrize(("grace", "closing", "code", "stderr"),
                         [(0.5, 30, 75, "prep: error: lost the head\n"), (10, 0, 0, "")])
def test_closing_ray_after_the_head_is_lost_is_bounded(grace: float, closing: float, code: int, stderr: str) -> None:
    """A disconnect that hangs once the head is lost ends the process with the error's line and
    exit code after the grace period; one that returns in time is left alone."""
    ran = subprocess.run([sys.executable, "-c", STUCK, str(grace), str(closing)], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert (ran.returncode, ran.stderr) == (code, stderr)
    assert ran.stdout == ("closed\n" if code == 0 else "")
