"""prep.data's node-local cache over a real S3 endpoint (moto's server over HTTP): bounded at every
moment, row for row a pulled folder's reader, fail-closed on corrupt bytes in the store or the
cache, safe for two processes on one cache directory, and Belady beating LRU on a rereading plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.data.reader import Reader
from prep.errors import IntegrityError, UsageError
from prep.storage import open_store
from prep.storage.backend import Store
from prep.store import cas
from prep.transfer.pull import pull
from tests.s3support import RequestHook, admin_client, new_bucket
from tests.snapshot_factory import Built, build_snapshot

SEQ, GLOBAL = 128, 32
SHARD = 20_000  # bytes: 10,000 uint16 tokens


@pytest.fixture(scope="module")
def remote(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Eight shards of one snapshot in an S3 bucket, and the same snapshot pulled into a folder."""
    root = tmp_path_factory.mktemp("cache")
    url = f"{new_bucket()}/datasets"
    store = open_store(url)
    built = build_snapshot(store, root / "work", shard_sizes=(SHARD,) * 8, formats=("bin",))
    pull(store, built.snapshot, root / "dest")
    return {"url": url, "store": store, "built": built, "dest": root / "dest"}


def cached(remote: dict[str, Any], cache_dir: Path, cache_bytes: int, **options: Any) -> Reader:
    return Reader("demo@latest", seq_len=SEQ, global_batch_size=GLOBAL, store=remote["url"], cache_dir=cache_dir,
                  cache_bytes=cache_bytes, **options)


def cache_usage(cache_dir: Path) -> int:
    """Bytes in the cache's objects folder, temporaries included."""
    total = 0
    for entry in os.scandir(cache_dir / "objects"):
        try:
            total += entry.stat().st_size
        except FileNotFoundError:
            pass
    return total


class Sampler:
    """A thread measuring the cache folder as often as it can while a reader works."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir, self.peak, self.samples = cache_dir, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if (self.cache_dir / "objects").exists():
                self.peak = max(self.peak, cache_usage(self.cache_dir))
                self.samples += 1

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def object_gets(hooks: list[RequestHook]) -> Counter[str]:
    """Count the server's GETs per object sha256 from now on."""
    counts: Counter[str] = Counter()

    def count(environ: dict[str, Any]) -> None:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") == "GET" and "/objects/" in path:
            counts[path.rsplit("/", 1)[-1]] += 1

    hooks.append(count)
    return counts


@pytest.mark.parametrize("prefetch", [0, 3], ids=["on-demand", "prefetch"])
def test_a_cache_smaller_than_the_snapshot_reads_an_epoch_row_for_row_within_its_bound(
        remote: dict[str, Any], tmp_path: Path, prefetch: int) -> None:
    limit = 3 * SHARD + SHARD // 2  # three of eight shards
    pulled = Reader(remote["dest"], seq_len=SEQ, global_batch_size=GLOBAL)
    steps = pulled.sizes[0] // GLOBAL
    with Sampler(tmp_path / "cache") as sampler, cached(remote, tmp_path / "cache", limit,
                                                        prefetch_steps=prefetch) as reader:
        for step in range(steps):
            assert (reader.batch(step) == pulled.batch(step)).all(), f"step {step}"
            assert cache_usage(tmp_path / "cache") <= limit
        stats = reader.stats()
    assert steps >= 15 and sampler.samples > steps and sampler.peak <= limit
    cache = stats["cache"]
    assert cache["peak_cache_bytes"] <= limit and cache["evictions"] > 0
    assert cache["bytes_fetched"] == cache["fetches"] * SHARD > 8 * SHARD
    assert cache["bytes_refetched"] == cache["bytes_fetched"] - 8 * SHARD
    if prefetch:
        assert cache["prefetch_lead_seconds_median"] is not None


def test_a_corrupted_object_in_the_store_is_refused_and_named(s3_endpoint: str, tmp_path: Path) -> None:
    url = f"{new_bucket()}/datasets"
    store = open_store(url)
    built = build_snapshot(store, tmp_path / "work", shard_sizes=(SHARD,) * 3, formats=("bin",))
    bad = sorted(built.snapshot.artifacts, key=lambda a: a["path"])[1]
    bucket, prefix = url[len("s3://"):].split("/", 1)
    data = bytearray(built.files[bad["path"]])
    data[100] ^= 0xFF
    admin_client().put_object(Bucket=bucket, Key=f"{prefix}/{cas.object_key(bad['sha256'])}", Body=bytes(data))
    reader = Reader("demo@latest", seq_len=SEQ, global_batch_size=8, store=url, cache_dir=tmp_path / "cache",
                    cache_bytes=10 * SHARD, prefetch_steps=4)
    with pytest.raises(IntegrityError, match=rf"{cas.object_key(bad['sha256'])} for sha256:[0-9a-f]+ bin/00001.bin"):
        for step in range(30):
            reader.batch(step)
    reader.close()
    assert not (tmp_path / "cache" / "objects" / bad["sha256"]).exists()
    assert [p.name for p in (tmp_path / "cache" / "objects").iterdir() if bad["sha256"] in p.name] == []


def test_a_corrupted_cache_file_is_refused_and_named(remote: dict[str, Any], tmp_path: Path) -> None:
    with cached(remote, tmp_path / "cache", 10 * SHARD) as reader:
        reader.batch(0)
    victim = sorted((tmp_path / "cache" / "objects").iterdir())[0]
    data = bytearray(victim.read_bytes())
    data[10] ^= 0x01
    victim.write_bytes(bytes(data))
    with cached(remote, tmp_path / "cache", 10 * SHARD) as again, \
            pytest.raises(IntegrityError, match=rf"{victim}: does not match the snapshot .*cache file for"):
        again.batch(0)


def test_a_truncated_cache_file_is_fetched_again(remote: dict[str, Any], tmp_path: Path,
                                                  s3_request_hooks: list[RequestHook]) -> None:
    first = sorted(remote["built"].snapshot.artifacts, key=lambda a: a["path"])[0]
    objects = tmp_path / "cache" / "objects"
    objects.mkdir(parents=True)
    (objects / first["sha256"]).write_bytes(remote["built"].files[first["path"]][:SHARD // 3])
    gets = object_gets(s3_request_hooks)
    pulled = Reader(remote["dest"], seq_len=SEQ, global_batch_size=GLOBAL)
    with cached(remote, tmp_path / "cache", 10 * SHARD) as reader:
        assert (reader.batch(0) == pulled.batch(0)).all()
    assert gets[first["sha256"]] >= 1
    assert (objects / first["sha256"]).stat().st_size == SHARD


READ_SCRIPT = """
import json, sys
from prep.data.reader import Reader
url, cache, limit, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Reader("demo@latest", seq_len=128, global_batch_size=32, store=url, cache_dir=cache, cache_bytes=limit,
            prefetch_steps=2) as reader:
    digest = [int(reader.batch(step).sum()) for step in range(steps)]
    print(json.dumps({"sums": digest, "stats": reader.stats()}))
"""


def test_a_fetch_killed_midway_leaves_nothing_that_looks_complete(s3_endpoint: str, tmp_path: Path) -> None:
    url = f"{new_bucket()}/datasets"
    size = 3 << 20  # three 1 MiB chunks per object
    build_snapshot(open_store(url), tmp_path / "work", shard_sizes=(size, size), formats=("bin",))
    cache = tmp_path / "cache"
    command = [sys.executable, "-c", READ_SCRIPT, url, str(cache), str(3 * size), "2"]
    env = dict(os.environ, PREP_CRASH_AT="pull.after_chunk:2")
    killed = subprocess.run(command, env=env, capture_output=True, start_new_session=True, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = list((cache / "objects").iterdir())
    assert any(".prep-tmp-" in p.name for p in left)  # the killed fetch's temporary...
    assert all(p.stat().st_size == size for p in left if ".prep-tmp-" not in p.name)  # ...and nothing torn
    again = subprocess.run(command, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["stats"]["cache"]["fetches"] >= 1
    assert sorted(p.name for p in (cache / "objects").iterdir() if ".prep-tmp-" in p.name) == []
    assert len(list((cache / "users").glob("*.json"))) == 0  # the dead reader's file is gone too


def test_two_processes_on_one_cache_fetch_each_shard_once(remote: dict[str, Any], tmp_path: Path,
                                                          s3_request_hooks: list[RequestHook]) -> None:
    gets = object_gets(s3_request_hooks)
    command = [sys.executable, "-c", READ_SCRIPT, remote["url"], str(tmp_path / "cache"), str(8 * SHARD), "12"]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    assert reports[0]["sums"] == reports[1]["sums"]
    shas = {a["sha256"] for a in remote["built"].snapshot.artifacts}
    shard_gets = {sha: count for sha, count in gets.items() if sha in shas}  # manifests are read by each
    assert set(shard_gets) == shas and set(shard_gets.values()) == {1}
    assert sum(r["stats"]["cache"]["fetches"] for r in reports) == len(shas)


def test_two_snapshots_sharing_shards_share_the_cached_copies(s3_endpoint: str, tmp_path: Path) -> None:
    url = f"{new_bucket()}/datasets"
    store = open_store(url)
    build_snapshot(store, tmp_path / "a", dataset="first", shard_sizes=(SHARD,) * 3, formats=("bin",))
    build_snapshot(store, tmp_path / "b", dataset="second", shard_sizes=(SHARD,) * 3, formats=("bin",))
    readers = [Reader(f"{name}@latest", seq_len=SEQ, global_batch_size=8, store=store, cache_dir=tmp_path / "cache",
                      cache_bytes=3 * SHARD) for name in ("first", "second")]
    assert readers[0].sources[0].id != readers[1].sources[0].id
    for reader in readers:
        for step in range(5):
            reader.batch(step)
    assert readers[0].stats()["cache"]["fetches"] == 3 and readers[1].stats()["cache"]["fetches"] == 0
    assert readers[1].stats()["cache"]["hits"] > 0
    for reader in readers:
        reader.close()


def test_a_shard_larger_than_the_cache_and_a_remote_store_without_one_are_usage_errors(
        remote: dict[str, Any], tmp_path: Path) -> None:
    with cached(remote, tmp_path / "cache", SHARD - 1) as reader, \
            pytest.raises(UsageError, match=r"bin/0000\d.bin is 20000 bytes, more than cache_bytes 19999"):
        reader.batch(0)
    with pytest.raises(UsageError, match="needs the node-local cache"):
        Reader("demo@latest", seq_len=SEQ, global_batch_size=GLOBAL, store=remote["url"])
    with pytest.raises(UsageError, match="cache_dir=... and cache_bytes=... together"):
        Reader("demo@latest", seq_len=SEQ, global_batch_size=GLOBAL, store=remote["url"], cache_dir=tmp_path)


def bytes_fetched(store: Store | str, cache_dir: Path, policy: str, steps: int, built: Built) -> int:
    with Reader("demo@latest", seq_len=SEQ, global_batch_size=GLOBAL, store=store, cache_dir=cache_dir,
                cache_bytes=4 * SHARD, policy=policy, prefetch_steps=0) as reader:
        for step in range(steps):
            reader.batch(step)
        fetched: int = reader.stats()["cache"]["bytes_fetched"]
    return fetched



def test_pressure_answered_during_a_step_drops_that_steps_pins_when_it_ends(
        remote: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefetch thread may answer another user's pressure while a step holds its pins: those pins
    cannot go then, and must go when the step settles (not stay pinned until the next signal)."""
    with cached(remote, tmp_path / "cache", 8 * SHARD, prefetch_steps=0) as reader:
        reader.batch(0)
        assert reader.cache is not None and reader.cache.held()
        cache = reader.cache
        pin_held = cache.pin_held

        def pin_then_answer(needs: Any) -> Any:
            holds = pin_held(needs)
            cache.answer_pressure()  # as the poll of an idle prefetch thread would, mid-step
            return holds

        monkeypatch.setattr(cache, "pin_held", pin_then_answer)
        cache.dir.signal_pressure()
        reader.batch(1)
        assert cache.held() == frozenset()

def test_belady_fetches_fewer_bytes_than_lru_when_epochs_reread(remote: dict[str, Any], tmp_path: Path) -> None:
    steps = 2 * (Reader(remote["dest"], seq_len=SEQ, global_batch_size=GLOBAL).sizes[0] // GLOBAL)
    belady = bytes_fetched(remote["url"], tmp_path / "belady", "belady", steps, remote["built"])
    lru = bytes_fetched(remote["url"], tmp_path / "lru", "lru", steps, remote["built"])
    assert belady < lru
    assert np.isfinite(belady) and belady >= 8 * SHARD


def test_steps_out_of_order_and_a_resumed_state_read_the_same_rows(remote: dict[str, Any], tmp_path: Path) -> None:
    """The plan (and the samples it precomputed) follows jumps: backwards, forwards, a resume."""
    pulled = Reader(remote["dest"], seq_len=SEQ, global_batch_size=GLOBAL)
    with cached(remote, tmp_path / "cache", 4 * SHARD, prefetch_steps=3) as reader:
        for step in (0, 1, 2, 7, 3, 3, 30, 1, 31, 32):
            assert (reader.batch(step) == pulled.batch(step)).all(), f"step {step}"
        state = {**reader.state_dict(), "samples": 12 * GLOBAL}
    with cached(remote, tmp_path / "cache", 4 * SHARD, prefetch_steps=3) as resumed:
        resumed.load_state_dict(state)
        for step, batch in zip(range(12, 20), resumed):
            assert (batch == pulled.batch(step)).all(), f"step {step}"


def test_a_pin_kept_between_steps_serves_the_proven_copy_and_a_replaced_cache_file_is_refused_after_it(
        remote: dict[str, Any], tmp_path: Path) -> None:
    """The check is by content: a cache file replaced behind a reader's back (same size, other bytes) is not
    read through the map pinned before, and refused when the reader opens the object again."""
    pulled = Reader(remote["dest"], seq_len=SEQ, global_batch_size=GLOBAL)
    with cached(remote, tmp_path / "cache", 8 * SHARD, prefetch_steps=0) as reader:
        assert (reader.batch(0) == pulled.batch(0)).all()
        assert reader.plan is not None and reader.cache is not None
        victim = tmp_path / "cache" / "objects" / sorted(reader.plan.objects(1))[0]
        forged = bytearray(victim.read_bytes())
        forged[10] ^= 0x01
        (tmp_path / "forged").write_bytes(bytes(forged))
        os.replace(tmp_path / "forged", victim)
        assert (reader.batch(1) == pulled.batch(1)).all()
        # signalled after step 1, not before: a prefetch thread's poll may answer at once, and step 1
        # must find its pins (the reader drops its idle pins by the end of step 2 at the latest)
        reader.cache.dir.signal_pressure()
        with pytest.raises(IntegrityError, match=rf"{victim}: does not match the snapshot .*cache file for"):
            for step in range(2, 10):
                reader.batch(step)
