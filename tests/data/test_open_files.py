"""A reader holds a bounded number of shard files open, whatever the shard count: a 20 TB snapshot
has about 80,000 shards and a training process often may open only 1024 files. Rows read by
position need the file open; past the budget the least recently used file is closed, and a batch
touching more shards than the budget reads them in turns, with the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.data import source as source_module
from prep.data.reader import Reader
from prep.storage import LocalStore
from prep.transfer.pull import pull
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL, SHARDS = 16, 256, 120


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A snapshot of 120 small `.bin` shards, published and pulled."""
    root = tmp_path_factory.mktemp("many-shards")
    store = LocalStore(root / "store")
    built = build_snapshot(store, root / "work", shard_sizes=(2_000,) * SHARDS, formats=("bin",))
    pull(store, built.snapshot, root / "dest")
    return {"store": store, "dest": root / "dest"}


def sums(reader: Reader, steps: int) -> list[int]:
    return [int(reader.batch(step).sum()) for step in range(steps)]


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_batch_touching_more_shards_than_the_budget_reads_them_in_turns(
        many: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    with Reader(many["dest"], SEQ, GLOBAL) as reader:
        expected = sums(reader, 6)
        assert len(reader.sources[0]._files) > 3  # noqa: SLF001 -- the budget below binds
    monkeypatch.setattr(source_module, "MAX_OPEN_SHARDS", 3)
    before = open_descriptors()
    with Reader(many["dest"], SEQ, GLOBAL) as reader:
        assert sums(reader, 6) == expected
        assert len(reader.sources[0]._files) <= 3  # noqa: SLF001
        assert open_descriptors() <= before + 3
        assert int(reader.sources[0].tokens(999, 2_002).sum()) == int(np.concatenate(  # crosses three shards
            [reader.sources[0].tokens(999, 1), reader.sources[0].tokens(1_000, 1_000),
             reader.sources[0].tokens(2_000, 1_001)]).sum())


def test_a_cache_backed_reader_pins_at_most_its_budget_of_files(many: dict[str, Any], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with Reader(many["dest"], SEQ, GLOBAL) as reader:
        expected = sums(reader, 4)
    with Reader("demo@latest", SEQ, GLOBAL, store=many["store"], cache_dir=tmp_path / "cache",
                cache_bytes=2_000 * SHARDS) as reader:
        assert sums(reader, 4) == expected
        assert reader.cache is not None and len(reader.cache.held()) > 3  # the budget below binds
    monkeypatch.setattr(source_module, "MAX_OPEN_SHARDS", 3)
    with Reader("demo@latest", SEQ, GLOBAL, store=many["store"], cache_dir=tmp_path / "cache",
                cache_bytes=2_000 * SHARDS) as reader:
        for step in range(4):
            assert int(reader.batch(step).sum()) == expected[step]
            assert reader.cache is not None and len(reader.cache.held()) <= 3


LOW_LIMIT_SCRIPT = """
import json, resource, sys
from prep.data.reader import Reader
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
spec = json.loads(sys.argv[1])
with Reader(spec["source"], spec["seq"], spec["global"], **spec["options"]) as reader:
    print(json.dumps([int(reader.batch(step).sum()) for step in range(spec["steps"])]))
"""


@pytest.mark.parametrize("cached", [False, True], ids=["pulled", "cache"])
def test_a_process_allowed_64_descriptors_reads_a_snapshot_of_120_shards(
        many: dict[str, Any], tmp_path: Path, cached: bool) -> None:
    """Regression: each shard read stayed open (with its cache pin's lock, two descriptors), so the
    60-odd a process could hold ran out (`Too many open files`) where memory maps, which hold no
    descriptor, had read on."""
    with Reader(many["dest"], SEQ, GLOBAL) as reader:
        expected = sums(reader, 8)
    options = {"store": str(many["store"].root), "cache_dir": str(tmp_path / "cache"),
               "cache_bytes": 2_000 * SHARDS} if cached else {}
    spec = {"source": "demo@latest" if cached else str(many["dest"]), "seq": SEQ, "global": GLOBAL, "steps": 8,
            "options": options}
    run = subprocess.run([sys.executable, "-c", LOW_LIMIT_SCRIPT, json.dumps(spec)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == expected


def test_a_mixture_divides_the_budget_among_its_sources(many: dict[str, Any], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_module, "MAX_OPEN_SHARDS", 4)
    mixture = tmp_path / "mixture.toml"
    mixture.write_text("".join(f'[[source]]\nsnapshot = "{many["dest"]}"\nweight = 1\n' for _ in range(2)))
    with Reader(mixture, SEQ, GLOBAL) as reader:
        assert [source.max_open for source in reader.sources] == [2, 2]
        for step in range(4):
            reader.batch(step)
            assert sum(len(source._files) for source in reader.sources) <= 4  # noqa: SLF001
