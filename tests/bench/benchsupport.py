"""Shared pieces of the build benchmarks: corpora and tokenizers from ../shared/bench, and
wall time plus peak RSS (summed over a process tree) of a command."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_BENCH = Path(os.environ.get("PREP_SHARED_BENCH", REPO.parent / "shared" / "bench"))


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_rss: int  # bytes, summed over the process and its descendants
    stdout: str


@dataclass(frozen=True)
class Setup:
    """What every build benchmark starts from: its options, corpora by size, a tokenizer."""

    workdir: Path
    workers: int
    corpora: list[Path]
    tokenizer: Path
    runs: int = 1  # rounds over every size, for benchmarks that take medians


def setup(description: str | None, default_sizes: str) -> Setup:
    """Parse the common options and make (or reuse) the corpora and the 50,257-id tokenizer."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=default_sizes,
                        help="corpus sizes in MB, comma-separated (this machine holds ~470 MB of distinct text)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=1, help="rounds over every size (where the benchmark takes medians)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(corpus(args.workdir, 100), args.workdir / "tokenizer-50257.json")
    corpora = [corpus(args.workdir, int(mb)) for mb in args.sizes.split(",")]
    return Setup(args.workdir, args.workers, corpora, tok, max(1, args.runs))


def corpus(workdir: Path, mb: int) -> Path:
    """A real-text JSON Lines corpus of `mb` MB under `workdir` (made once, reused)."""
    out = workdir / f"corpus-{mb}"
    files = max(8, mb // 40)
    if not any(out.glob("*.jsonl")):
        subprocess.run([sys.executable, str(SHARED_BENCH / "make_corpus.py"), str(out), "--mb", str(mb),
                        "--files", str(files)], check=True, stdout=subprocess.DEVNULL)
    return out


def tokenizer(corpus_dir: Path, out: Path, vocab: int = 50257) -> Path:
    if not out.exists():
        subprocess.run([sys.executable, str(SHARED_BENCH / "make_tokenizer.py"), str(corpus_dir), str(out),
                        "--vocab", str(vocab)], check=True, stdout=subprocess.DEVNULL)
    return out


def _tree_status(root: int) -> dict[int, tuple[int, int]]:
    """(VmRSS, VmHWM) in bytes of every live process of the tree under `root`."""
    found: dict[int, tuple[int, int]] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS:", "VmHWM:")))
            found[pid] = (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    stack.extend(int(child) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, KeyError):
            continue
    return found


def measure(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    """Run `command`, sampling the RSS of its whole process tree every 50 ms."""
    run = measure_tree(command, env=env, cwd=cwd)
    return Run(run.seconds, run.peak_rss, run.stdout)


def pipeline(folder: Path, corpus_dir: Path, tokenizer_path: Path, backend: str) -> Path:
    path = folder / f"bench-{backend}.toml"
    path.write_text(f'dataset = "bench"\nseed = 1\n[input]\npaths = ["{corpus_dir}"]\nid_field = "id"\n'
                    f'[tokenizer]\npath = "{tokenizer_path}"\nbackend = "{backend}"\n'
                    f'[output]\nshard_size = "256MB"\nformats = ["bin", "wds"]\n')
    return path


def prep_build(pipeline_path: Path, store: Path, workers: int, *options: str) -> Run:
    return measure([sys.executable, "-m", "prep.cli.main", "build", str(pipeline_path), "--store", str(store),
                    "--workers", str(workers), *options], cwd=REPO)


def corpus_bytes(corpus_dir: Path) -> int:
    """Bytes of text (UTF-8) in the corpus, the unit of every MB/s figure here."""
    import json

    total = 0
    for path in sorted(corpus_dir.glob("*.jsonl")):
        with open(path, encoding="utf-8") as handle:
            total += sum(len(json.loads(line)["text"].encode()) for line in handle)
    return total


@dataclass(frozen=True)
class TreeRun:
    """A run with its stderr and the peak RSS (VmHWM) of its largest single process."""

    seconds: float
    peak_rss: int  # bytes, summed over the tree (sampled)
    max_process_rss: int  # bytes, the largest VmHWM of any one process of the tree
    stdout: str
    stderr: str
    stage_rss: dict[str, int] = field(default_factory=dict)
    """Per build stage (from the progress lines), the largest VmRSS any one process had in a
    sample while the stage ran: sampled every 50 ms, so a short peak may be missed."""
    cpu_seconds: float = 0.0
    """User and system seconds of the process and of every descendant reaped below it (its workers,
    the zygote and the zygote's forks): what the work cost, less moved than wall seconds by a
    machine whose cores are shared."""
    driver_rss: int = 0
    """Bytes, the VmHWM of the process started (the driver)."""
    worker_rss: int = 0
    """Bytes, the largest VmHWM of any process below it (workers, a zygote and its forks)."""
    processes: int = 0
    """Processes of the tree seen by the sampler, the driver included."""


_STAGE_LINE = re.compile(r"\] (\w+): ")


def measure_tree(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> TreeRun:
    """Run `command`, sampling the RSS of its whole process tree and of every single process
    every 50 ms, and attributing samples to the build stage its progress lines last named;
    keeps stdout and stderr."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True)
    peak, peaks, stage_rss = 0, dict[int, int](), dict[str, int]()
    lines: list[str] = []
    stage = ["start"]
    done = threading.Event()

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if (match := _STAGE_LINE.search(line)) is not None:
                stage[0] = match[1]

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            status = _tree_status(process.pid)
            peak = max(peak, sum(rss for rss, _ in status.values()))
            for pid, (rss, hwm) in status.items():
                peaks[pid] = max(peaks.get(pid, 0), hwm)
                stage_rss[stage[0]] = max(stage_rss.get(stage[0], 0), rss)
            done.wait(0.05)

    threads = [threading.Thread(target=read_stderr, daemon=True), threading.Thread(target=sample, daemon=True)]
    for thread in threads:
        thread.start()
    assert process.stdout is not None
    stdout = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)  # Popen.wait would not give the tree's rusage
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    done.set()
    for thread in threads:
        thread.join()
    stderr = "".join(lines)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {process.returncode}: {stderr[-2000:]}")
    return TreeRun(seconds, peak, max(peaks.values(), default=0), stdout, stderr, stage_rss,
                   usage.ru_utime + usage.ru_stime, peaks.get(process.pid, 0),
                   max((hwm for pid, hwm in peaks.items() if pid != process.pid), default=0), len(peaks))


def stage_megabytes(run: TreeRun) -> str:
    """`run.stage_rss` in MB, as JSON, in the order the stages ran."""
    import json

    return json.dumps({stage: round(rss / 2**20) for stage, rss in run.stage_rss.items()})


def stage_seconds(stderr: str) -> dict[str, float]:
    """Seconds per stage from a build's progress lines (`<stage>: done in 1.2s, ...`)."""
    return {match[1]: float(match[2]) for match in re.finditer(r"\] (\w+): done in ([0-9.]+)s", stderr)}


def du_bytes(path: Path) -> int:
    """Bytes of every regular file under `path` (each inode once)."""
    seen: set[int] = set()
    total = 0
    for file in path.rglob("*"):
        info = file.lstat()
        if file.is_file() and not file.is_symlink() and info.st_ino not in seen:
            seen.add(info.st_ino)
            total += info.st_size
    return total


def best_of(repeat: int, action: Callable[[], object], prepare: Callable[[], object] = lambda: None) -> float:
    """Fastest wall time of `action` over `repeat` runs, `prepare` untimed before each."""
    best = float("inf")
    for _ in range(repeat):
        prepare()
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best
