"""The node-local cache's record of proven files (`.prep/verified.jsonl`) stays bounded by what the
cache holds: every fetch appended a line, so 600 steps through a small cache left 390 KB of record
beside 235 KB of objects. It is compacted atomically while readers run, keeps a line for every
cached file it proves, drops torn lines, and another user's compaction never swallows this
user's appends."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from prep.data.cacherecord import SLACK_BYTES, SLACK_LINES, CacheRecord
from prep.data.reader import Reader
from prep.storage import LocalStore
from prep.transfer.shares import stamp
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL, SHARD = 16, 8, 4_000


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalStore:
    """Sixteen 4 KB shards (bin only) of `demo@latest` in a local store."""
    root = tmp_path_factory.mktemp("cacherecord")
    store = LocalStore(root / "store")
    build_snapshot(store, root / "work", shard_sizes=(SHARD,) * 16, formats=("bin",))
    return store


def _lines(record: Path) -> list[Any]:
    return [json.loads(line) for line in record.read_bytes().splitlines()]


def _objects(cache: Path) -> dict[str, os.stat_result]:
    return {path.name: path.stat() for path in (cache / "objects").iterdir() if not path.name.startswith(".")}


def test_many_fetches_through_a_small_cache_keep_the_record_bounded(store: LocalStore, tmp_path: Path) -> None:
    cache, most = tmp_path / "cache", 0
    record = cache / ".prep" / "verified.jsonl"
    with Reader("demo@latest", SEQ, GLOBAL, store=store, cache_dir=cache, cache_bytes=3 * SHARD,
                prefetch_steps=2) as reader:
        for step in range(200):
            reader.batch(step)
            most = max(most, record.stat().st_size)
        fetches = reader.stats()["cache"]["fetches"]
    assert fetches > 800  # a line each: about 200 KB of record without compaction
    held = len(_objects(cache))
    assert held <= 3 and most <= 2 * (2 * held + SLACK_LINES) * 256 + SLACK_BYTES, (most, held)
    proven = {name: tuple(numbers) for name, sha, *numbers in _lines(record) if name == sha}
    assert all(proven.get(name) == stamp(info) for name, info in _objects(cache).items())  # nothing useful lost


def _fill(record: CacheRecord, names: list[str], info: os.stat_result) -> None:
    for name in names:
        record.add(name, name, info)


def test_another_users_compaction_does_not_swallow_this_users_appends(tmp_path: Path) -> None:
    """An append goes to the record now at the name, not to the file a compaction renamed over."""
    (tmp_path / ".prep").mkdir()
    kept = tmp_path / ("a" * 64)
    kept.write_bytes(b"x")
    info = kept.stat()
    mine, other = CacheRecord(tmp_path), CacheRecord(tmp_path)
    _fill(mine, [f"{n:064x}" for n in range(2 * SLACK_LINES)], info)  # lines of files no longer cached
    other.tend({kept.name: info})  # rewritten: no line proves a file present
    assert mine.path.read_bytes() == b""
    mine.add(kept.name, kept.name, info)
    assert [row[0] for row in _lines(mine.path)] == [kept.name]
    mine.close()
    other.close()


def test_a_torn_line_is_dropped_and_a_killed_compactions_temporary_removed(tmp_path: Path) -> None:
    (tmp_path / ".prep").mkdir()
    files = [tmp_path / f"{n:064x}" for n in range(3)]
    for file in files:
        file.write_bytes(b"y")
    record = CacheRecord(tmp_path)
    _fill(record, [file.name for file in files] * SLACK_LINES, files[0].stat())
    record.close()
    with open(record.path, "ab") as out:
        out.write(b'["' + files[1].name.encode() + b'","')  # torn: the writer was killed midway
    leftover = record.path.with_name(".verified.jsonl.prep-tmp-123456789abc")
    leftover.write_text("half a compaction")
    fresh = CacheRecord(tmp_path)
    fresh.tend({file.name: file.stat() for file in files})
    assert [row[0] for row in _lines(fresh.path)] == [files[0].name]  # the others' stamps were never theirs
    assert fresh.proven(files[0].name, files[0].stat()) == files[0].name and not leftover.exists()
    fresh.close()
