"""Job descriptions stay small whatever the corpus size (issue 44): every job a build hands a
worker, in every stage (near-duplicate removal's included), pickles to the same size for a corpus
cut into ten times the parts, and far under 64 KB: tables as long as the corpus go to the store
once and jobs name them by id. (An order job lists the entries objects it reads, at most
[build] merge_fan_in: 4 here, so both corpora reach it.)"""

from __future__ import annotations

import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner import nearrounds
from prep.runner.build import build
from prep.stages import read
from prep.storage.local import LocalStore
from tests.neardup.nearstatsupport import write_sized_corpus
from tests.runner.buildsupport import InProcessExecutor

LIMIT = 64 * 1024


class MeasuringExecutor(InProcessExecutor):
    """Runs jobs in this process and keeps the largest pickled job of each job function."""

    def __init__(self) -> None:
        self.largest: dict[str, int] = defaultdict(int)

    def run(self, fn: Any, items: Any) -> Any:
        name = getattr(fn, "fn", fn).__name__  # a CodeChecked wraps the job function
        for index, item in enumerate(items):
            self.largest[name] = max(self.largest[name], len(pickle.dumps(item)))
            yield index, fn(item)


def largest_jobs(root: Path, range_bytes: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, int]]:
    """The parts and the largest job of each kind of a fresh build of the sized corpus cut into parts of `range_bytes`."""
    executor = MeasuringExecutor()
    with monkeypatch.context() as patched:
        patched.setattr(read, "RANGE_BYTES", range_bytes)
        patched.setattr(nearrounds, "EDGES_PER_RANGE", 16)  # several ranges, so every round job is planned
        result = build(load_pipeline(root / "pipeline.toml"), LocalStore(root / f"store-{range_bytes}"), executor, (),
                       Progress(quiet=True))
    return result.stages["tokenize"].ran, dict(executor.largest)


def test_every_jobs_description_stays_the_same_size_for_ten_times_the_parts(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_sized_corpus(tmp_path, tokenizer_path, verify=True)
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(pipeline.read_text() + "\n[build]\nmerge_fan_in = 4\n")
    few_parts, few = largest_jobs(tmp_path, 40_000, monkeypatch)
    many_parts, many = largest_jobs(tmp_path, 2_500, monkeypatch)
    assert many_parts >= 10 * few_parts
    assert {"run_bucket_job", "run_route_job", "run_round_job", "run_range_drops_job", "run_cluster_job"} <= set(many)
    assert set(few) <= set(many) <= {*few, "run_merge_job"}  # ten times the parts need merging
    for kind, size in many.items():
        assert size < LIMIT and size <= few.get(kind, size) + 256, (kind, few.get(kind), size)
