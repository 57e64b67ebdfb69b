"""Progress on stderr: one redrawn line per stage on a terminal (checked on a real pseudo-terminal),
plain throttled lines in a log or pipe, nothing with --quiet; and the shared count helpers."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep import progress
from prep.progress import Progress, eta, plural
from tests.helpers import make_records, prep_env, run_prep, write_jsonl, write_pipeline

CLEAR = "\r\x1b[K"
STAGES = ["inputs", "tokenize", "order", "shard"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _not_quiet() -> Iterator[None]:
    progress.set_quiet(False)
    yield
    progress.set_quiet(False)


def kept_lines(output: str) -> list[str]:
    """What a terminal shows once `output` is drawn: each line's text after its last redraw."""
    return [line.rsplit(CLEAR, 1)[-1] for line in output.replace("\r\n", "\n").split("\n") if line]


def test_plural_and_eta() -> None:
    assert [plural(0, "file"), plural(1, "file"), plural(2, "file")] == ["0 files", "1 file", "2 files"]
    assert plural(3, "index", "indices") == "3 indices" and plural(1, "index", "indices") == "1 index"
    assert [eta(0.4), eta(42), eta(425), eta(7980)] == ["0s", "42s", "7m05s", "2h13m"]


def test_a_terminal_gets_one_redrawn_line_per_stage() -> None:
    stream = Terminal()
    report = Progress(stream)
    report.stage("tokenize", "4 tasks over 4 files, 1.0 MB")
    report.tick("tokenize", 0, 4, 0, force=True)
    for done in range(1, 5):
        report.tick("tokenize", done, 4, 0, done * 250_000, force=True)
    report.info("warning: something to keep")
    report.done("tokenize", "4 run, 0 cached")
    report.stage("shard", "1 shards")
    report.done("shard", "2 files written, 0 cached")
    output = stream.getvalue()
    lines = kept_lines(output)
    assert len(lines) == 3 and lines[0].endswith("warning: something to keep")
    assert "tokenize: done in" in lines[1] and "shard: done in" in lines[2]
    draws = output.split(CLEAR)[1:]
    assert any("tokenize: 2/4 tasks (0 cached), 500.0 kB" in draw and "MB/s, ETA " in draw for draw in draws)
    last_tick = next(draw for draw in draws if "tokenize: 4/4 tasks" in draw)
    assert "ETA" not in last_tick  # none once all are done
    warning = next(index for index, draw in enumerate(draws) if "something to keep" in draw)
    assert draws[warning + 1] == last_tick  # the live line is drawn again below the kept one


def test_a_pipe_gets_plain_lines_at_most_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    report = Progress(stream)
    report.stage("tokenize", "100 tasks")
    report.tick("tokenize", 0, 100, 0, force=True)
    for done in range(1, 101):
        clock[0] += 0.1  # 10 s in all: two lines at most from the interval
        report.tick("tokenize", done, 100, 0, done * 1000)
    report.done("tokenize", "100 run, 0 cached")
    output = stream.getvalue()
    assert "\r" not in output and "\x1b" not in output
    lines = output.splitlines()
    assert lines[0].endswith("tokenize: 100 tasks") and lines[-1].endswith("tokenize: done in 10.0s, 100 run, 0 cached")
    ticks = [line for line in lines if "tasks (" in line]
    assert 2 <= len(ticks) <= 1 + 10 / progress.STAGE_INTERVAL_LOG + 1


def test_quiet_prints_nothing_and_is_the_default_once_set() -> None:
    stream = Terminal()
    progress.set_quiet(True)
    report = Progress(stream)
    report.stage("inputs", "discovering")
    report.tick("inputs", 1, 2, 0, force=True)
    report.info("published")
    report.done("inputs", "1 file")
    progress.end_line()
    meter = report.meter("pull", 1, 10)
    meter.add(10)
    meter.finish()
    assert stream.getvalue() == ""
    assert Progress(stream, quiet=False).quiet is False


def test_an_open_line_is_ended_before_an_error() -> None:
    stream = Terminal()
    report = Progress(stream)
    report.stage("tokenize", "2 tasks")
    assert not stream.getvalue().endswith("\n")
    progress.end_line()
    assert stream.getvalue().endswith("tokenize: 2 tasks\n")
    progress.end_line()  # nothing open any more: no blank line
    assert stream.getvalue().count("\n") == 1


@pytest.fixture()
def project(tmp_path: Path, tokenizer_path: Path) -> Path:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(40, seed=3))
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(40, seed=4))
    write_pipeline(tmp_path, tokenizer_path)
    return tmp_path


def run_on_terminal(args: list[str | Path]) -> tuple[int, str, str]:
    """Run prep with stderr on a new pseudo-terminal; (exit code, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "prep.cli.main", *map(str, args)], stdout=subprocess.PIPE,
                               stderr=slave, env=prep_env(), text=True)
    os.close(slave)
    received = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            received += chunk
        elif process.poll() is not None:
            break
    os.close(master)
    stdout = process.communicate(timeout=60)[0]
    return process.returncode, stdout, received.decode()


def test_build_on_a_pseudo_terminal_redraws_one_line_per_stage(project: Path) -> None:
    code, stdout, terminal = run_on_terminal(["build", project / "pipeline.toml", "--store", project / "store",
                                              "--workers", "1"])
    assert code == 0, terminal
    assert stdout.strip().startswith("sha256:")
    lines = kept_lines(terminal)
    staged = [line for line in lines if line.split("] ", 1)[1].split(":")[0] in STAGES]
    assert [line.split("] ", 1)[1].split(":")[0] for line in staged] == STAGES, lines  # one kept line each
    assert all(": done in " in line for line in staged) and any("published sha256:" in line for line in lines)
    tokenize = next(line for line in terminal.replace("\r\n", "\n").split("\n") if "tokenize: done" in line)
    assert tokenize.count(CLEAR) >= 3  # the stage line, its task counts and its final line, drawn in place


def test_build_into_a_pipe_prints_plain_lines_and_quiet_prints_nothing(project: Path) -> None:
    logged = run_prep("build", project / "pipeline.toml", "--store", project / "store", "--workers", "1")
    assert "\r" not in logged.stderr and "\x1b" not in logged.stderr
    assert all(f"{stage}: done in" in logged.stderr for stage in STAGES)
    for front, back in (([], ["--quiet"]), (["-q"], []), ([], ["-q"])):  # the group's option and the command's
        quiet = run_prep(*front, "build", project / "pipeline.toml", "--store", project / "other", "--workers", "1",
                         *back)
        assert quiet.stderr == "" and quiet.stdout.strip() == logged.stdout.strip()
