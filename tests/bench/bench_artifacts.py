"""Benchmark (not a test): the commands that walk every artifact, on a snapshot of 100,000.

    python -m tests.bench.bench_artifacts [--artifacts 100000] [--changed 10] [--repeat 3] [--workdir DIR]

A 20 TB snapshot has about 240,000 artifact files; what matters here is their count, not their
bytes, so the artifacts are tiny (per shard a .bin, an .idx and a .tar of a few dozen bytes).
Publishes two such snapshots into a local store (`many@v1`, and `many@v2` with --changed
artifacts of other bytes), pulls v1 once, then times from the command line, interpreter
start-up included, best of --repeat:

* `prep show`, `prep diff v1 v2`, `prep verify --quick` of the pulled folder;
* a no-op `prep pull` (everything already valid, proven by the record of an earlier pull), the
  same without that record (every file re-hashed), and `prep pull --prune` alternating between
  v2 and v1 (only the changed artifacts are copied, and pruned);

and in-process the rank shares for world sizes 8 and 512. Prints seconds for each.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from prep.storage.local import LocalStore
from prep.store.snapshots import Snapshot
from prep.transfer.shares import artifacts_of, partition, share_of
from tests.bench.benchsupport import best_of
from tests.snapshot_factory import many_artifacts

PREP = [sys.executable, "-m", "prep.cli.main"]


def run(command: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run a command; exit with its stderr unless its exit status is one of `ok`."""
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode not in ok:
        raise SystemExit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}")
    return result


def timed(label: str, action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    print(f"  ({label}: {seconds:.1f} s)", flush=True)
    return seconds


def share_timings(snapshot: Snapshot, repeat: int) -> list[tuple[str, float]]:
    """In-process: reading the artifacts, all shares at once and one rank's share, per world size."""
    artifacts = artifacts_of(snapshot.manifest)
    rows = [("artifacts_of (manifest -> Artifact list)", best_of(repeat, lambda: artifacts_of(snapshot.manifest)))]
    for world in (8, 512):
        rows.append((f"partition, world size {world} (every share)",
                     best_of(repeat, partial(partition, artifacts, world))))
        rows.append((f"share_of one rank, world size {world}", best_of(repeat, partial(share_of, artifacts, 1, world))))
    return rows


def cli_timings(store: Path, dest: Path, repeat: int) -> list[tuple[str, float]]:
    """The commands users run, from a fresh interpreter each time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREP_")} | {"PREP_STORE": str(store)}
    record = dest / ".prep" / "verified.jsonl"
    pull_v1 = [*PREP, "pull", "many@v1", str(dest)]
    rows = [
        ("python -c 'import prep.cli.main' (start-up floor)",
         best_of(repeat, lambda: run([sys.executable, "-c", "import prep.cli.main"], env))),
        ("prep show many@v1", best_of(repeat, lambda: run([*PREP, "show", "many@v1"], env))),
        ("prep diff many@v1 many@v2", best_of(repeat, lambda: run([*PREP, "diff", "many@v1", "many@v2"], env, (1,)))),
        ("prep verify --quick (pulled folder)",
         best_of(repeat, lambda: run([*PREP, "verify", "--quick", str(dest / ".prep/manifest.json"), str(dest)], env))),
        ("prep pull, no-op (reuse proven by the record)", best_of(repeat, lambda: run(pull_v1, env))),
        ("prep pull --rank 3 --world-size 8, no-op",
         best_of(repeat, lambda: run([*pull_v1, "--rank", "3", "--world-size", "8"], env))),
        ("prep pull, no-op without the record (re-hash all)",
         best_of(repeat, lambda: run(pull_v1, env), lambda: record.unlink(missing_ok=True))),
    ]
    flips = [0.0, 0.0]

    def flip() -> None:
        for index, ref in enumerate(("many@v2", "many@v1")):
            started = time.perf_counter()
            run([*PREP, "pull", ref, str(dest), "--prune"], env)
            flips[index] = min(flips[index] or float("inf"), time.perf_counter() - started)

    for _ in range(repeat):
        flip()
    rows += [("prep pull many@v2 --prune into v1's folder", flips[0]),
             ("prep pull many@v1 --prune into v2's folder", flips[1])]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=10, help="Artifacts whose bytes differ in many@v2.")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="Default: a temporary folder, removed after.")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="prep-bench-artifacts-", dir=args.workdir))
    try:
        store = LocalStore(root / "store")
        print(f"{args.artifacts:,} artifacts, {args.changed} changed in v2; best of {args.repeat}; "
              f"{os.cpu_count()} CPUs", flush=True)
        snapshot = many_artifacts(store, args.artifacts, ref="v1")
        timed("published v2", lambda: many_artifacts(store, args.artifacts, changed=args.changed, ref="v2"))
        print(f"  (manifest: {len(snapshot.raw) / 1e6:.1f} MB)")
        dest = root / "dest"
        timed("first pull of v1, fsyncing every file",
              lambda: run([*PREP, "pull", "many@v1", str(dest)], dict(os.environ, PREP_STORE=str(store.root))))
        rows = cli_timings(store.root, dest, args.repeat) + share_timings(snapshot, args.repeat)
        print(f"{'what':<56} {'seconds':>8}")
        for name, seconds in rows:
            print(f"{name:<56} {seconds:8.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
