"""Benchmark (not a test): how long `prep --help` and a failing read-only command take, beside the
same help when every command module is imported first (what click's default help listing does).

    python -m tests.bench.bench_cli [--repeat 7]

Each figure is the best of `--repeat` fresh interpreter runs, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench.benchsupport import best_of

IMPORT_ALL = ("import importlib\nfrom prep.cli.main import COMMANDS, main\n"
              "[importlib.import_module(target.split(':')[0]) for target in COMMANDS.values()]\n"
              "main(['--help'])")


def timed(repeat: int, command: list[str], cwd: Path) -> float:
    """Best wall seconds of `command` over `repeat` runs (its exit code is not checked)."""
    return best_of(repeat, lambda: subprocess.run(command, cwd=cwd, capture_output=True, check=False))


def main() -> None:
    """Print the three timings and their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as work:
        cwd = Path(work)
        bare = timed(repeat, [sys.executable, "-c", "pass"], cwd)
        lazy = timed(repeat, [sys.executable, "-m", "prep.cli.main", "--help"], cwd)
        eager = timed(repeat, [sys.executable, "-c", IMPORT_ALL], cwd)
        refused = timed(repeat, [sys.executable, "-m", "prep.cli.main", "ls", "--store", "absent"], cwd)
    print(f"python -c pass:                      {bare * 1000:6.0f} ms")
    print(f"prep --help (summary table):         {lazy * 1000:6.0f} ms")
    print(f"prep --help, every command imported: {eager * 1000:6.0f} ms  ({eager / lazy:.1f}x the table's)")
    print(f"prep ls --store absent (refused):    {refused * 1000:6.0f} ms")


if __name__ == "__main__":
    main()
