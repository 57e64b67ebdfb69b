"""Benchmark (not a test): issue 44's 600-file build, local and on Ray clusters of 1, 2 and 3
raylets, with the driver before issue 44 and now, side by side in one run.

    python -m tests.bench.bench_nodes [--files 600] [--mb 6] [--latency-ms 20] [--raylets 1,2,3]
        [--before ffbd5ec~1] [--rounds 1] [--workdir /tmp/prep-bench]

The corpus: `--mb` MB of whole documents of bench_fast's real text (../shared/bench/make_corpus.py),
dealt round-robin into `--files` JSON Lines files (one tokenize task each), uploaded to moto's S3
server, whose every answer is held `--latency-ms` (as bench_driver does: nearer real S3 than
loopback). The store is a fresh bucket on the same server for every build. The pipeline writes
`bin` shards with gigatoken and the GPT-2-sized BPE tokenizer of the bench folder.

Each code version is a git worktree (`--before`, default the commit before issue 44's first
driver change, and HEAD) whose CLI runs the build; a Ray cluster is started per version and size
(`ray start`, every raylet with `--num-cpus=1`, its files and HOME in a folder of its own and the
version's tree on PYTHONPATH, as separate machines would hold it), and the CLI joins it with
`--executor ray --ray-address`. The local executor runs `--workers 2`, the machine's cores.

Reported per build: wall seconds; tokenize tasks per second of wall time; the driver's CPU
seconds (the CLI process and, for the local executor, nothing of its workers: measured from
/proc before the workers' share is added); and the workers' busy fraction, the CPU seconds the
machine spent outside the driver and the S3 server (from /proc/stat, so Ray's own daemons count
as workers) over wall seconds times the worker slots (2 local, the raylets' CPUs on Ray, at most
the machine's cores). Each version's builds must give one snapshot id (the code is part of it, so the two versions' differ).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.bench.bench_driver import serve
from tests.bench.benchsupport import REPO, corpus, tokenizer
from tests.s3support import admin_client, s3_env

BEFORE = "ffbd5ec~1"
"""The commit before issue 44's first driver change (ffbd5ec: a commit one PUT, lookups 32 at a time)."""


@dataclass(frozen=True)
class Result:
    version: str
    executor: str
    wall: float
    tasks: int
    driver_cpu: float
    busy: float
    snapshot: str


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    fields = [int(value) for value in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def process_cpu(pid: int) -> float:
    """User and system seconds of process `pid` and of its reaped children."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def make_files(workdir: Path, files: int, megabytes: float) -> Path:
    """`files` JSON Lines files dealt round-robin from `megabytes` MB of the real-text corpus."""
    out = workdir / f"nodes-{files}-{megabytes:g}"
    if out.exists():
        return out
    lines = [line for path in sorted(corpus(workdir, 100).glob("*.jsonl")) for line in path.read_text().splitlines()]
    random.Random(0).shuffle(lines)
    chosen, size = [], 0
    for line in lines:
        if size >= megabytes * 1e6:
            break
        chosen.append(line)
        size += len(line)
    staging = workdir / f"{out.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for index in range(files):
        (staging / f"{index:04d}.jsonl").write_text("".join(f"{line}\n" for line in chosen[index::files]))
    staging.rename(out)
    return out


def upload(folder: Path, bucket: str) -> str:
    client = admin_client()
    client.create_bucket(Bucket=bucket)
    for path in sorted(folder.glob("*.jsonl")):
        client.put_object(Bucket=bucket, Key=f"corpus/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/corpus/"


def worktree(rev: str, workdir: Path) -> Path:
    """A checkout of `rev` (made once) whose CLI runs that version's build."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    if sha == subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip():
        return REPO
    tree = workdir / f"tree-{sha[:12]}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=REPO, check=True,
                       capture_output=True)
    return tree


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def ray_cluster(raylets: int, tree: Path, env: dict[str, str]) -> Iterator[str]:
    """`raylets` raylets of one CPU each, started by `ray start --block` (the head first), every
    one with its files and HOME in a folder of its own; yields the head's address."""
    port, nodes, folders = free_port(), [], []
    ray = Path(sys.executable).with_name("ray")
    try:
        for index in range(raylets):
            folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
            folders.append(folder)
            role = ["--head", f"--port={port}", "--include-dashboard=false"] if index == 0 else [f"--address=127.0.0.1:{port}"]
            node = subprocess.Popen([str(ray), "start", "--block", "--disable-usage-stats", "--num-cpus=1",
                                     f"--temp-dir={folder}", *role], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=tree, start_new_session=True,
                                    env={**env, "HOME": folder, "RAY_TMPDIR": folder, "PYTHONPATH": str(tree)})
            nodes.append(node)
            assert node.stdout is not None
            for line in node.stdout:
                if "Ray runtime started" in line:
                    break
            else:
                raise SystemExit(f"ray start failed for raylet {index}")
        yield f"127.0.0.1:{port}"
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
            node.wait()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def write_pipeline(folder: Path, inputs: str, tokenizer_path: Path) -> Path:
    path = folder / "nodes.toml"
    path.write_text(f'dataset = "nodes"\nseed = 1\n[input]\npaths = ["{inputs}"]\nid_field = "id"\n'
                    f'[tokenizer]\npath = "{tokenizer_path}"\nbackend = "gigatoken"\n'
                    f'[output]\nshard_size = "256MB"\nformats = ["bin"]\n')
    return path


def build(version: str, tree: Path, pipeline: Path, env: dict[str, str], server: int, executor: str,
          options: list[str], slots: int) -> Result:
    """One build into a new bucket: wall, tokenize tasks/s, driver CPU, the workers' busy fraction."""
    bucket = f"store-{version}-{executor.replace(' ', '')}-{time.monotonic_ns()}".lower()
    admin_client().create_bucket(Bucket=bucket)
    busy_before, total_before = cpu_ticks()
    server_before = process_cpu(server)
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "prep.cli.main", "build", str(pipeline), "--store",
                                f"s3://{bucket}/store", "--json", *options], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tree, env={**env, "PYTHONPATH": str(tree)})
    driver_cpu = 0.0
    while process.poll() is None:  # the driver's own CPU, read while it lives (its workers are reaped into it later)
        try:
            driver_cpu = max(driver_cpu, _own_cpu(process.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    if process.returncode:
        raise SystemExit(f"{version} {executor} build failed ({process.returncode}):\n{stderr}")
    busy_after, total_after = cpu_ticks()
    cores = os.cpu_count() or 1
    machine = (busy_after - busy_before) / os.sysconf("SC_CLK_TCK")
    workers = machine - driver_cpu - (process_cpu(server) - server_before)
    report = json.loads(stdout)
    tasks = {stage["name"]: stage["ran"] for stage in report["stages"]}["tokenize"]
    return Result(version, executor, wall, tasks, driver_cpu, workers / (wall * min(slots, cores)), report["snapshot"])


def _own_cpu(pid: int) -> float:
    """User and system seconds of process `pid` itself (its threads), not its children."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=600)
    parser.add_argument("--mb", type=float, default=6.0)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--raylets", default="1,2,3")
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    args = parser.parse_args()
    folder = make_files(args.workdir, args.files, args.mb)
    tokenizer_path = tokenizer(corpus(args.workdir, 100), args.workdir / "tokenizer-50257.json")
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    moto = multiprocessing.Process(target=serve, args=(args.latency_ms / 1000, ports), daemon=True)
    moto.start()
    endpoint = f"http://127.0.0.1:{ports.get(timeout=60)}"
    env = {**os.environ, **s3_env(endpoint), "RAY_USAGE_STATS_ENABLED": "0"}
    os.environ.update(s3_env(endpoint))
    inputs = upload(folder, f"corpus-{time.monotonic_ns()}")
    work = Path(tempfile.mkdtemp(prefix="nodes"))
    pipeline = write_pipeline(work, inputs, tokenizer_path)
    versions = {"before": worktree(args.before, args.workdir), "now": REPO}
    results: list[Result] = []
    for _ in range(args.rounds):
        for version, tree in versions.items():
            assert moto.pid is not None
            results.append(build(version, tree, pipeline, env, moto.pid, "local", ["--workers", "2"], 2))
            print(results[-1], file=sys.stderr, flush=True)
            for raylets in map(int, args.raylets.split(",")):
                with ray_cluster(raylets, tree, env) as address:
                    results.append(build(version, tree, pipeline, env, moto.pid, f"ray x{raylets}",
                                         ["--executor", "ray", "--ray-address", address, "--workers", str(raylets)],
                                         raylets))
                print(results[-1], file=sys.stderr, flush=True)
    report(results, args)
    moto.terminate()


def report(results: list[Result], args: argparse.Namespace) -> None:
    ids = {version: {result.snapshot for result in results if result.version == version} for version in ("before", "now")}
    same = all(len(found) <= 1 for found in ids.values())  # the code is part of a snapshot's id: one per version
    print(f"{args.files} files, {args.mb:g} MB, moto at {args.latency_ms:g} ms a request, {os.cpu_count()} cores; "
          f"{'one snapshot id per version on every executor' if same else f'snapshot ids differ: {ids}'}")
    print(f"{'executor':<10} {'version':<8} {'wall s':>8} {'tasks/s':>8} {'driver CPU s':>13} {'busy':>6}")
    for result in sorted(results, key=lambda result: (result.executor, result.version)):
        print(f"{result.executor:<10} {result.version:<8} {result.wall:>8.1f} {result.tasks / result.wall:>8.1f} "
              f"{result.driver_cpu:>13.1f} {result.busy:>6.2f}")
    for executor in sorted({result.executor for result in results}):
        walls = {result.version: result.wall for result in results if result.executor == executor}
        if {"before", "now"} <= set(walls):
            print(f"{executor}: before / now wall {walls['before'] / walls['now']:.2f}")


if __name__ == "__main__":
    main()
