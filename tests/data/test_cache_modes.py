"""The node-local cache under every reader mode, over real built snapshots in a local store (the
cache copies from it like from S3): windows longer than a shard, documents mode (the .idx files
come through the cache too), a mixture of two snapshots, max_epochs ending the plan, and a cache-backed
reader pickled (for spawned DataLoader workers)."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.data import nodecache
from prep.data.reader import Reader
from prep.errors import UsageError
from prep.storage import LocalStore
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.snapshot_factory import build_snapshot


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    """Two datasets built into one local store (several 2 KB shards each) and pulled."""
    root = tmp_path_factory.mktemp("cache-modes")
    found = {"root": root, "store": root / "store"}
    for name, count, seed in (("web", 300, 1), ("code", 120, 2)):
        write_jsonl(root / name / "corpus" / "a.jsonl", make_records(count, seed=seed, prefix=name))
        pipeline = write_pipeline(root / name, tokenizer_path, dataset=name, shard_size="2KB")
        run_prep("build", pipeline, "--store", found["store"], "--workers", "2")
        run_prep("pull", f"{name}@latest", root / f"{name}-dest", "--store", found["store"])
    return found


def pair(built: dict[str, Path], tmp_path: Path, source: str, pulled: str | Path, cache_bytes: int,
         **settings: Any) -> tuple[Reader, Reader]:
    """A reader through a fresh cache and the same reader over the pulled folder(s)."""
    cached = Reader(source, store=built["store"], cache_dir=tmp_path / "cache", cache_bytes=cache_bytes,
                    prefetch_steps=2, **settings)
    return cached, Reader(pulled, store=built["store"], **settings)


def largest_shard(reader: Reader) -> int:
    return max(shard.tokens for source in reader.sources for shard in source.shards) * 2


def test_windows_longer_than_a_shard_cross_several(built: dict[str, Path], tmp_path: Path) -> None:
    probe = Reader(built["root"] / "web-dest", seq_len=8, global_batch_size=1)
    shard_tokens = min(s.tokens for s in probe.sources[0].shards)
    seq = 2 * shard_tokens + 3  # every window spans at least three shards
    cached, pulled = pair(built, tmp_path, "web@latest", built["root"] / "web-dest", 4 * largest_shard(probe),
                          seq_len=seq, global_batch_size=2)
    with cached:
        for step in range(cached.sizes[0] // 2):
            assert (cached.batch(step) == pulled.batch(step)).all()
        assert cached.stats()["cache"]["peak_cache_bytes"] <= 4 * largest_shard(probe)


def test_documents_mode_reads_the_idx_through_the_cache(built: dict[str, Path], tmp_path: Path) -> None:
    cached, pulled = pair(built, tmp_path, "web@latest", built["root"] / "web-dest", 1 << 20, seq_len=1,
                          global_batch_size=4, mode="documents")
    with cached:
        for step in range(20):
            assert all(np.array_equal(a, b) for a, b in zip(cached.batch(step), pulled.batch(step), strict=True))
        idx = {a["sha256"] for a in cached.sources[0].snapshot.manifest["artifacts"] if a["format"] == "idx"}
        assert idx <= {p.name for p in (tmp_path / "cache" / "objects").iterdir()}


def test_a_documents_reader_that_has_not_read_yet_leaves_other_users_room(built: dict[str, Path], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening in documents mode reads every .idx through the cache; their pins stayed until a batch
    settled them, so a reader that had not read yet (a DataLoader's main-process dataset never
    does) held room another user of the cache waited for, then failed on."""
    monkeypatch.setattr(nodecache, "ROOM_WAIT_SECONDS", 2.0)
    probe = Reader(built["root"] / "web-dest", seq_len=1, global_batch_size=2, mode="documents")
    artifacts = probe.sources[0].snapshot.manifest["artifacts"]
    limit = 2 * max(a["size"] for a in artifacts if a["format"] == "bin")
    assert sum(a["size"] for a in artifacts if a["format"] == "idx") > limit  # the .idx files do not all fit
    settings: dict[str, Any] = {"store": built["store"], "cache_dir": tmp_path / "cache", "cache_bytes": limit,
                                "seq_len": 1, "global_batch_size": 2, "mode": "documents"}
    with Reader("web@latest", **settings) as idle, Reader("web@latest", **settings) as other:
        assert idle.cache is not None and idle.cache.held() == frozenset()
        for step in range(10):
            assert all((a == b).all() for a, b in zip(other.batch(step), probe.batch(step)))


def test_a_mixture_of_two_snapshots_through_one_cache(built: dict[str, Path], tmp_path: Path) -> None:
    specs = tmp_path / "specs.toml"
    specs.write_text('seed = 3\n[[source]]\nsnapshot = "web@latest"\nweight = 0.7\n'
                     '[[source]]\nsnapshot = "code@latest"\nweight = 0.3\nmax_epochs = 2\n')
    folders = built["root"] / "folders.toml"
    folders.write_text('seed = 3\n[[source]]\nsnapshot = "web-dest"\nweight = 0.7\n'
                       '[[source]]\nsnapshot = "code-dest"\nweight = 0.3\nmax_epochs = 2\n')
    probe = Reader(folders, seq_len=16, global_batch_size=8)
    limit = 3 * largest_shard(probe)
    cached, pulled = pair(built, tmp_path, str(specs), folders, limit, seq_len=16, global_batch_size=8)
    with cached:
        assert cached.state_dict() == pulled.state_dict()
        rows = [(a, b) for a, b in zip(cached, pulled)]  # until code's max_epochs ends both
        assert len(rows) > 10 and all((a == b).all() for a, b in rows)
        assert cached.plan is not None and cached.plan.upcoming(None, None) == []  # the plan ended too
        assert cached.stats()["cache"]["peak_cache_bytes"] <= limit


def test_a_cache_backed_reader_pickles_as_its_settings_and_state(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    build_snapshot(store, tmp_path / "first", shard_sizes=(20_000,) * 3, formats=("bin",))
    settings: dict[str, Any] = {"seq_len": 128, "global_batch_size": 8, "store": store,
                                "cache_dir": tmp_path / "cache", "cache_bytes": 60_000}
    with Reader("demo@latest", **settings) as reader:
        expected = [reader.batch(step) for step in range(6)]
        reader.consumed = 3 * 8
        with pickle.loads(pickle.dumps(reader)) as again:
            assert again.cache is not None and again.cache is not reader.cache
            assert again.state_dict() == reader.state_dict()
            assert all((again.batch(step) == expected[step]).all() for step in range(6))
            assert len(list((tmp_path / "cache" / "users").glob("*.json"))) == 2  # a user of its own
        frozen = pickle.dumps(reader)
    build_snapshot(store, tmp_path / "second", shard_sizes=(20_000,) * 3, formats=("bin",), seed=1)
    with pytest.raises(UsageError, match="reader state is for sources"):
        pickle.loads(frozen)  # demo@latest moved meanwhile: not the data the state names


def test_spawned_dataloader_workers_read_through_the_cache(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from prep.data.torch import ReaderDataset

    store = LocalStore(tmp_path / "store")
    build_snapshot(store, tmp_path / "work", shard_sizes=(20_000,) * 3, formats=("bin",))
    settings: dict[str, Any] = {"store": store, "cache_dir": tmp_path / "cache", "cache_bytes": 60_000}
    with Reader("demo@latest", 128, 8, **settings) as reader:
        expected = [reader.batch(step) for step in range(6)]
    dataset = ReaderDataset("demo@latest", 128, 8, **settings)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = [batch.numpy() for _, batch in zip(range(6), loader)]
    assert all((a == b).all() for a, b in zip(got, expected))
    assert _prefetch_threads() == []  # the dataset's own reader, kept for its state, never read


def _prefetch_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("prep-prefetch")]


def test_prefetch_threads_run_from_the_first_batch_until_close(tmp_path: Path) -> None:
    """Regression: every cache-backed reader started its prefetch threads when built, so the one a
    ReaderDataset keeps in the training process for its state (never read, never closed) left four
    threads polling the cache every 0.1 s for the rest of the run."""
    store = LocalStore(tmp_path / "store")
    build_snapshot(store, tmp_path / "work", shard_sizes=(20_000,) * 3, formats=("bin",))
    reader = Reader("demo@latest", 128, 8, store=store, cache_dir=tmp_path / "cache", cache_bytes=60_000, jobs=3)
    try:
        assert _prefetch_threads() == []
        reader.batch(0)
        assert len(_prefetch_threads()) == 3
    finally:
        reader.close()
    assert _prefetch_threads() == []
