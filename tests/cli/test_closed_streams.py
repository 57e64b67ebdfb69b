"""The CLI when nobody reads its output: stdout closed early (`| head`) or on a full disk, stderr
closed or full. Progress is advisory, the exit code never lies, and no traceback is attempted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from prep.storage.local import LocalStore
from tests.helpers import make_records, prep_env, write_jsonl, write_pipeline
from tests.snapshot_factory import build_snapshot

STDOUT_CLOSED = 141


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding one small snapshot, demo@latest."""
    root = tmp_path_factory.mktemp("streams")
    local = LocalStore(root / "store")
    build_snapshot(local, root / "work", shard_sizes=(3_000,))
    return local.root


@contextmanager
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe whose reader is gone: every write is EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


def run(*args: str | Path, stdout: int | None = None, stderr: int | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "prep.cli.main", *map(str, args)], env=prep_env(), timeout=120,
                          stdout=stdout if stdout is not None else subprocess.PIPE,
                          stderr=stderr if stderr is not None else subprocess.PIPE, check=False)


@pytest.mark.parametrize("args", [["show", "demo@latest"], ["show", "demo@latest", "--json"], ["log", "demo"],
                                  ["diff", "demo@latest", "demo@latest", "--json"]])
def test_a_reader_that_closed_stdout_gets_exit_141_and_silence(store: Path, args: list[str]) -> None:
    """Regression: click exited 1 (`diff`'s "differences found", `verify`'s mismatch)."""
    with closed_pipe() as stdout:
        result = run(*args, "--store", store, stdout=stdout)
    assert (result.returncode, result.stderr) == (STDOUT_CLOSED, b"")


def test_json_on_a_full_stdout_is_the_one_line_and_exit_4(store: Path) -> None:
    """Regression: the error object was written to the stdout that had just failed: a traceback, exit 1."""
    with open("/dev/full", "wb") as full:
        result = run("diff", "demo@latest", "demo@latest", "--json", "--store", store, stdout=full.fileno())
    assert result.returncode == 4
    assert result.stderr.decode() == "prep: error: I/O error: No space left on device\n"


@pytest.fixture
def pipeline(tmp_path: Path, tokenizer_path: Path) -> Path:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(20, seed=4))
    return write_pipeline(tmp_path, tokenizer_path, ["corpus"])


def test_a_build_whose_stderr_is_full_still_builds(pipeline: Path, tmp_path: Path) -> None:
    """Regression: the first progress line failed the build (exit 1, nothing printed)."""
    with open("/dev/full", "wb") as full:
        result = run("build", pipeline, "--store", tmp_path / "store", stderr=full.fileno())
    assert result.returncode == 0
    snapshot = result.stdout.decode().split()[-1]
    shown = run("show", snapshot, "--store", tmp_path / "store")
    assert shown.returncode == 0 and snapshot.encode() in shown.stdout


def test_an_error_with_stderr_closed_keeps_its_exit_code_and_json_object(tmp_path: Path) -> None:
    with closed_pipe() as stderr:
        result = run("build", tmp_path / "missing.toml", "--json", stderr=stderr)
    assert result.returncode == 2
    assert result.stdout.startswith(b'{"schema": "prep.error/1"') and b"missing.toml" in result.stdout
    with closed_pipe() as stderr:
        assert run("build", tmp_path / "missing.toml", stderr=stderr).returncode == 2
