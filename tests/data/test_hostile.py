"""prep.data under hostile input: mixture weights that are not finite, an empty shard, cache
options of the wrong type, steps and states out of range, sources past 2**32 epochs, a torch
iteration stopped early, and a fetch that outlives its reader's close()."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from prep.data import nodecache, prefetch
from prep.data.reader import MAX_SAMPLES, Reader
from prep.data.remote import CachedSource
from prep.errors import ConfigError, PrepError, UsageError
from prep.storage import LocalStore
from prep.transfer.pull import pull
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL = 16, 8


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A four-shard snapshot (bin only) in a local store, and the same snapshot pulled."""
    root = tmp_path_factory.mktemp("hostile")
    store = LocalStore(root / "store")
    built = build_snapshot(store, root / "work", shard_sizes=(20_000,) * 4, formats=("bin",))
    pull(store, built.snapshot, root / "dest")
    return {"root": root, "store": store, "dest": root / "dest"}


def mixture(folder: Path, dest: Path, *weights: str) -> Path:
    """A mixture file listing `dest` once per weight (TOML literals: nan, inf, 1e308)."""
    body = "".join(f'[[source]]\nsnapshot = "{dest}"\nweight = {weight}\n' for weight in weights)
    path = folder / "mixture.toml"
    path.write_text(body)
    return path


@pytest.mark.parametrize("weights", [("nan",), ("inf", "1.0"), ("1.0", "nan")])
def test_a_weight_that_is_not_finite_is_a_config_error_naming_it(small: dict[str, Any], tmp_path: Path,
                                                                  weights: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match=r"source\[\d\]\.weight: expected a finite number >= 0"):
        Reader(mixture(tmp_path, small["dest"], *weights), SEQ, GLOBAL)


def test_weights_whose_sum_overflows_still_mix_by_their_shares(small: dict[str, Any], tmp_path: Path) -> None:
    reader = Reader(mixture(tmp_path, small["dest"], "1e308", "1e308", "5e307"), SEQ, GLOBAL)
    assert reader.schedule.counts.tolist() == [4000, 4000, 2000]
    assert reader.batch(0).shape == (GLOBAL, SEQ + 1)


def test_a_window_across_an_empty_shard_reads_the_shards_around_it(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(2_000, 0, 2_000), formats=("bin",))
    pull(store, built.snapshot, tmp_path / "dest")
    stream = np.frombuffer(built.files["bin/00000.bin"] + built.files["bin/00002.bin"], dtype="<u2")
    pulled = Reader(tmp_path / "dest", SEQ, GLOBAL)
    assert (pulled.sources[0].tokens(990, 20) == stream[990:1010]).all()
    with Reader("demo@latest", SEQ, GLOBAL, store=store, cache_dir=tmp_path / "cache", cache_bytes=1 << 20) as cached:
        for step in range(pulled.sizes[0] // GLOBAL):
            assert (cached.batch(step) == pulled.batch(step)).all()


@pytest.mark.parametrize(("options", "message"), [
    ({"cache_bytes": "1GB"}, "cache_bytes must be an integer, got '1GB'"),
    ({"cache_bytes": 1.5}, "cache_bytes must be an integer, got 1.5"),
    ({"cache_bytes": True}, "cache_bytes must be an integer, got True"),
    ({"cache_bytes": 0}, "cache_bytes must be an integer >= 1, got 0"),
    ({"prefetch_steps": -1}, "prefetch_steps must be an integer >= 0, got -1"),
    ({"prefetch_bytes": -5}, "prefetch_bytes must be an integer >= 0, got -5"),
    ({"jobs": "4"}, "jobs must be an integer, got '4'"),
    ({"jobs": 0}, "jobs must be an integer >= 1, got 0"),
    ({"horizon": "x"}, "horizon must be an integer, got 'x'"),
    ({"cache_dir": 5}, "cache_dir must be a path, got 5"),
])
def test_cache_options_of_the_wrong_type_are_usage_errors_naming_them(small: dict[str, Any], tmp_path: Path,
                                                                      options: dict[str, Any], message: str) -> None:
    settings = {"cache_dir": tmp_path / "cache", "cache_bytes": 1 << 20, **options}
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        Reader("demo@latest", SEQ, GLOBAL, store=small["store"], **settings)


def test_a_cache_dir_that_is_a_file_is_a_usage_error(small: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(UsageError, match="is not a folder"):
        Reader("demo@latest", SEQ, GLOBAL, store=small["store"], cache_dir=tmp_path / "file", cache_bytes=1 << 20)


@pytest.mark.parametrize(("step", "message"), [
    (-1, "step must be an integer >= 0, got -1"),
    (1.5, "step must be an integer, got 1.5"),
    (MAX_SAMPLES // GLOBAL, "lies past the last step"),
    (2**64, "lies past the last step"),
])
def test_a_step_out_of_range_is_refused(small: dict[str, Any], step: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Reader(small["dest"], SEQ, GLOBAL).batch(step)


@pytest.mark.parametrize("samples", [2**63, 2**64, MAX_SAMPLES + GLOBAL])
def test_a_state_past_the_last_sample_is_refused_when_loaded(small: dict[str, Any], samples: int) -> None:
    reader = Reader(small["dest"], SEQ, GLOBAL)
    with pytest.raises(UsageError, match="invalid sample count"):
        reader.load_state_dict({**reader.state_dict(), "samples": samples})
    assert reader.consumed == 0


def test_a_source_past_2_32_epochs_keeps_its_own_permutation(small: dict[str, Any], tmp_path: Path) -> None:
    """(source, epoch) pairs were packed into one integer with 32 bits for the epoch: epoch 2**32
    of source 0 read as source 1's epoch 0."""
    reader = Reader(mixture(tmp_path, small["dest"], "1", "1"), SEQ, GLOBAL)
    size = reader.sizes[0]
    epoch = 2**32
    first = 2 * size * epoch  # both sources start epoch 2**32 here
    perms = [reader._permutation(source, epoch) for source in (0, 1)]
    # equal weights alternate the sources: the first two samples of each source's epoch
    expected = [(0, epoch, perms[0].at(0)), (1, epoch, perms[1].at(0)), (0, epoch, perms[0].at(1)),
                (1, epoch, perms[1].at(1))]
    assert reader.sample_ids(first, 4) == expected


def test_an_iteration_stopped_early_closes_its_reader(small: dict[str, Any], tmp_path: Path) -> None:
    """Each iteration opens a Reader; one left open kept its cache user, pins and prefetch threads."""
    from prep.data.torch import ReaderDataset

    dataset = ReaderDataset("demo@latest", SEQ, GLOBAL, store=small["store"], cache_dir=tmp_path / "cache",
                            cache_bytes=1 << 20)
    threads = threading.active_count()
    try:
        for _ in range(3):
            batches = cast(Generator[Any, None, None], iter(dataset))
            next(batches)
            batches.close()  # what a training loop's `break` does once the iterator is dropped
        assert len(list((tmp_path / "cache" / "users").glob("*.json"))) == 1  # the dataset's own reader
        assert threading.active_count() == threads
    finally:
        dataset._main_reader().close()


class _SlowStore(LocalStore):
    """Objects come by ranged reads; reads of objects other than `first` wait until `go` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.first = ""
        self.go, self.waiting = threading.Event(), threading.Event()

    def local_path(self, key: str) -> Path | None:
        return None if key.startswith("objects/") else super().local_path(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if self.first and self.first not in key:
            self.waiting.set()
            self.go.wait(30)
        return super().get_range(key, start, length)


def test_a_fetch_outliving_close_writes_through_none_of_its_old_descriptors(
        small: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() stops waiting for a slow prefetch; when it ends, it must not truncate and write the
    files that were given the cache's closed descriptor numbers meanwhile."""
    monkeypatch.setattr(prefetch, "JOIN_SECONDS", 0.05)
    store = _SlowStore(small["root"] / "store")
    reader = Reader("demo@latest", SEQ, 1, store=store, cache_dir=tmp_path / "cache", cache_bytes=1 << 20)
    source = reader.sources[0]
    assert isinstance(source, CachedSource)
    step = next(s for s in range(1000) if source.needs(np.asarray([reader.sample_ids(s, 1)[0][2] * SEQ]),
                                                       np.asarray([SEQ + 1])) == source.bin_needs[:1])
    store.first = source.shards[0].bin_sha256
    reader.batch(step)  # reads shard 0; the prefetches of the others hang
    assert store.waiting.wait(10) and reader._prefetcher is not None
    threads = list(reader._prefetcher._threads)
    reader.close()
    assert any(thread.is_alive() for thread in threads)  # close() did not wait for the hanging fetch
    victims = [tmp_path / f"victim-{n}" for n in range(16)]
    descriptors = []
    for victim in victims:
        victim.write_bytes(b"precious")
        descriptors.append(os.open(victim, os.O_RDWR))
    try:
        store.go.set()
        for thread in threads:
            thread.join(10)
        assert [victim.read_bytes() for victim in victims] == [b"precious"] * len(victims)
    finally:
        for fd in descriptors:
            os.close(fd)


@pytest.mark.parametrize("consumed", [1.5, -1, "3", None])
def test_a_dataset_state_of_a_bad_batch_count_is_refused_before_it_reaches_a_checkpoint(
        small: dict[str, Any], consumed: Any) -> None:
    from prep.data.torch import ReaderDataset

    dataset = ReaderDataset(small["dest"], SEQ, GLOBAL)
    with pytest.raises(UsageError, match="batches_consumed must be an integer"):
        dataset.state_dict(batches_consumed=consumed)


def test_the_cache_record_is_compacted_when_a_reader_opens_the_cache(small: dict[str, Any], tmp_path: Path) -> None:
    """Every fetch appends a line to the cache's .prep/verified.jsonl; a cache that thrashes
    must not grow it without bound (every reader that opens the cache reads all of it)."""
    settings: dict[str, Any] = {"store": small["store"], "cache_dir": tmp_path / "cache", "cache_bytes": 20_000,
                                "prefetch_steps": 0}
    record = tmp_path / "cache" / ".prep" / "verified.jsonl"
    with Reader("demo@latest", SEQ, GLOBAL, **settings) as reader:
        for step in range(40):
            reader.batch(step)
        fetches = reader.stats()["cache"]["fetches"]
    assert fetches > 100 and len(record.read_bytes().splitlines()) < fetches  # compacted as it ran (test_cache_record)
    with open(record, "ab") as out:  # lines past the bound, as a cache written by an older prep holds
        out.write(record.read_bytes().splitlines(keepends=True)[-1] * 100)
    with Reader("demo@latest", SEQ, GLOBAL, **settings) as again:
        assert len(record.read_bytes().splitlines()) <= 1  # the one complete object's line
        again.batch(0)  # and the record still proves what it kept


def test_prefetch_leads_kept_for_the_stats_stay_bounded_over_a_long_run(
        small: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One lead per prefetched object used was kept (and sorted at every stats() call) for the
    whole run: memory and time growing with the run's length."""
    monkeypatch.setattr(nodecache, "LEADS_KEPT", 4)
    with Reader("demo@latest", SEQ, 1, store=small["store"], cache_dir=tmp_path / "cache", cache_bytes=40_000,
                prefetch_steps=1, jobs=1) as reader:
        assert reader.cache is not None
        stats = reader.cache.stats
        for step in range(3000):  # until more objects were fetched ahead of their use (a lead each) than kept
            reader.batch(step)
            if stats.fetches - stats.misses > 8:
                break
            time.sleep(0.002)  # time for the prefetch to land before its use
        assert stats.fetches - stats.misses > 8
        assert len(stats.leads) <= 4
        assert reader.stats()["cache"]["prefetch_lead_seconds_min"] <= min(stats.leads)


@pytest.mark.parametrize("source", ["nope@latest", "demo@latest"])
def test_a_reader_that_fails_to_open_releases_its_cache_user(small: dict[str, Any], tmp_path: Path,
                                                             source: str) -> None:
    """An unresolvable spec, or a seq_len longer than the snapshot: the cache user opened first
    stayed registered (and its descriptors open) for the rest of the process."""
    with pytest.raises(PrepError):
        Reader(source, 10**9, GLOBAL, store=small["store"], cache_dir=tmp_path / "cache", cache_bytes=1 << 20)
    assert list((tmp_path / "cache" / "users").iterdir()) == []


def test_a_closed_reader_refuses_to_read_rather_than_pin_for_good(small: dict[str, Any], tmp_path: Path) -> None:
    """After close() a batch re-pinned the cache files it read, and nothing would ever release
    those pins: no user of the cache could evict the files again."""
    settings: dict[str, Any] = {"store": small["store"], "cache_dir": tmp_path / "cache", "cache_bytes": 1 << 20}
    reader = Reader("demo@latest", SEQ, GLOBAL, **settings)
    reader.batch(0)
    reader.close()
    with pytest.raises(UsageError, match="cache is closed"):
        reader.batch(1)
    with Reader("demo@latest", SEQ, GLOBAL, **settings) as other:
        assert other.cache is not None
        with other.cache.dir.locked():
            assert all(other.cache.dir.try_evict(sha) for sha in other.cache.dir.ledger({}).complete)


def test_a_reader_idle_between_steps_gives_up_its_pins_when_another_user_waits(
        small: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins kept between steps were dropped on pressure only at the holder's next batch: a reader
    that waits (a DataLoader worker whose batches are all queued, while the main loop waits for
    the worker that needs room) held them until the waiter gave up."""
    monkeypatch.setattr(nodecache, "ROOM_WAIT_SECONDS", 3.0)
    settings: dict[str, Any] = {"store": small["store"], "cache_dir": tmp_path / "cache", "cache_bytes": 40_000,
                                "prefetch_steps": 0}
    with Reader("demo@latest", SEQ, GLOBAL, **settings) as idle, Reader("demo@latest", SEQ, GLOBAL, **settings) as other:
        assert isinstance(idle.sources[0], CachedSource) and idle.cache is not None and other.cache is not None
        needs, starts = idle.sources[0].bin_needs, idle.sources[0].token_starts
        idle.window(0, 0)
        idle.window(0, int(starts[1]) // SEQ + 1)  # shards 0 and 1 read, kept pinned, then idle
        assert idle.cache.held() == {needs[0].sha256, needs[1].sha256}
        other.cache.release(other.cache.acquire(needs[2]))  # needs one of those two files' room
        assert len(idle.cache.held()) < 2
