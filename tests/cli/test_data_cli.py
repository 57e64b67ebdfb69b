"""`prep drill` end to end through the real CLI against moto's S3 server: the JSON report matches
its schema, the human summary names every rank, and bad flags are one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prep.manifest.schema import validate
from prep.storage import open_store
from tests.helpers import run_prep
from tests.s3support import new_bucket
from tests.snapshot_factory import build_snapshot


@pytest.fixture
def bucket(s3_endpoint: str, tmp_path: Path) -> str:
    url = f"{new_bucket()}/datasets"
    build_snapshot(open_store(url), tmp_path / "work", shard_sizes=(20_000,) * 4, formats=("bin",))
    return url


def test_drill_json_report_matches_its_schema(bucket: str, tmp_path: Path) -> None:
    result = run_prep("drill", "demo@latest", "--store", bucket, "--world-size", "2", "--cache-bytes", "100KB",
                      "--steps", "5", "--seq-len", "64", "--global-batch", "8", "--cache-dir", tmp_path / "cache",
                      "--json")
    report = json.loads(result.stdout)
    validate(report, "prep.drill-report/1", "drill report")
    assert report["settings"]["cache_bytes"] == 100_000 and len(report["ranks"]) == 2
    assert report["totals"]["distinct_objects_fetched"] == 4 and report["duplicates"]["fetches"] == 0
    assert sorted(p.name for p in (tmp_path / "cache" / "objects").iterdir() if not p.name.startswith(".")) \
        == sorted(a["sha256"] for a in json.loads(run_prep("show", "demo@latest", "--store", bucket, "--json")
                                                  .stdout)["artifacts"])


def test_drill_summary_names_every_rank(bucket: str) -> None:
    result = run_prep("drill", "demo@latest", "--store", bucket, "--world-size", "2", "--cache-bytes", "60000",
                      "--steps", "3", "--seq-len", "64", "--global-batch", "8")
    lines = result.stdout.splitlines()
    assert lines[0].startswith("demo@latest: 2 ranks (processes) read 3 steps")
    assert lines[1].startswith("  rank 0: first batch") and lines[2].startswith("  rank 1: first batch")
    assert lines[3].startswith("node: ") and "duplicate fetches" in lines[3]


@pytest.mark.parametrize(("flags", "message"), [
    (["--world-size", "3", "--global-batch", "8", "--cache-bytes", "1MB"],
     "--global-batch 8 is not a multiple of --world-size 3"),
    (["--world-size", "1", "--global-batch", "8", "--cache-bytes", "12XB"], "--cache-bytes: unknown size unit 'XB'"),
    (["--world-size", "1", "--global-batch", "8", "--cache-bytes", "100"], "is 20000 bytes, more than cache_bytes 100"),
])
def test_drill_errors_are_one_line(bucket: str, flags: list[str], message: str) -> None:
    result = run_prep("drill", "demo@latest", "--store", bucket, "--steps", "2", "--seq-len", "64", *flags, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("prep: error: ") and message in result.stderr


@pytest.mark.parametrize("command", [["consumed", "--samples", "1"],
                                     ["drill", "--world-size", "1", "--cache-bytes", "1MB", "--steps", "1",
                                      "--global-batch", "1"]])
def test_a_source_folder_that_does_not_exist_is_named_as_missing(command: list[str], tmp_path: Path) -> None:
    """It said ./prep-store is not a prep store (the store a snapshot spec would need)."""
    result = run_prep(command[0], tmp_path / "no-such-dest", *command[1:], "--seq-len", "4", check=False,
                      cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"prep: error: {tmp_path / 'no-such-dest'}: no such folder (a source is a pulled snapshot " \
                            "folder, a mixture file or a snapshot spec such as web@latest)\n"
