"""The Store contract, run against every backend: LocalStore and S3Store (on a moto server)."""

from __future__ import annotations

import io
import threading
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import NotFoundError
from prep.storage import LocalStore, Store
from prep.storage.s3 import S3Store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    bucket_url: str = request.getfixturevalue("s3_bucket")
    return S3Store(f"{bucket_url}/some/prefix")


def test_put_bytes_is_create_only(store: Store) -> None:
    assert store.put_bytes("data/a", b"first") is True
    assert store.put_bytes("data/a", b"second") is False
    assert store.get_bytes("data/a") == b"first"


def test_put_file_is_create_only(store: Store, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(b"one")
    second.write_bytes(b"two")
    assert store.put_file("data/f", first) is True
    assert store.put_file("data/f", second) is False
    assert store.get_bytes("data/f") == b"one"
    assert first.read_bytes() == b"one"  # the caller's file is left alone


def test_put_file_keeps_no_tie_to_the_callers_file(store: Store, tmp_path: Path) -> None:
    """Regression: LocalStore hard-linked any file it was given, so the caller's file became
    read-only and a later write to it changed the stored object in place."""
    mine = tmp_path / "mine"
    mine.write_bytes(b"stored bytes")
    mine.chmod(0o644)
    assert store.put_file("data/mine", mine) is True
    assert mine.stat().st_mode & 0o777 == 0o644
    with open(mine, "r+b") as handle:
        handle.write(b"changed")
    assert store.get_bytes("data/mine") == b"stored bytes"


def test_empty_object(store: Store) -> None:
    assert store.put_bytes("data/empty", b"")
    assert store.get_bytes("data/empty") == b""
    info = store.head("data/empty")
    assert info is not None and info.size == 0


def test_get_range_and_head(store: Store) -> None:
    data = bytes(range(256)) * 40
    store.put_bytes("data/r", data)
    assert store.get_range("data/r", 0, 10) == data[:10]
    assert store.get_range("data/r", 1000, 300) == data[1000:1300]
    assert store.get_range("data/r", len(data) - 5, 100) == data[-5:]
    assert store.get_range("data/r", len(data) + 10, 5) == b""
    assert store.get_range("data/r", 7, 0) == b""
    info = store.head("data/r")
    assert info is not None and info.key == "data/r" and info.size == len(data)
    assert store.exists("data/r") and not store.exists("data/other")


def test_open_streams(store: Store) -> None:
    data = b"line one\nline two\n" + bytes(3000)
    store.put_bytes("data/s", data)
    with store.open("data/s") as stream:
        assert stream.read(4) == b"line"
        buffer = bytearray(5)
        assert isinstance(stream, io.BufferedIOBase)  # so readinto is there too
        assert stream.readinto(buffer) == 5 and bytes(buffer) == b" one\n"
        assert stream.readline() == b"line two\n"
        stream.seek(2)
        assert stream.read(3) == b"ne "
        assert stream.read() == data[5:]
        assert stream.read(10) == b""


def test_missing_keys(store: Store) -> None:
    assert store.head("nope") is None
    with pytest.raises(NotFoundError):
        store.open("nope")
    with pytest.raises(NotFoundError):
        store.get_bytes("nope/deeper")
    with pytest.raises(NotFoundError):
        store.get_range("nope", 0, 10)
    with pytest.raises(NotFoundError):
        store.require("nope")
    assert store.read_ref("refs/nope") is None


def test_list_is_sorted_and_prefix_filtered(store: Store) -> None:
    keys = ["a/2", "a/10", "a/1", "ab", "b/x/y", "a/sub/z"]
    for key in keys:
        store.put_bytes(key, key.encode())
    assert [info.key for info in store.list("a/")] == ["a/1", "a/10", "a/2", "a/sub/z"]
    assert [info.key for info in store.list("a")] == ["a/1", "a/10", "a/2", "a/sub/z", "ab"]
    assert [info.key for info in store.list("")] == sorted(keys)
    assert [info.key for info in store.list("b/x/")] == ["b/x/y"]
    assert list(store.list("c/")) == []
    sizes = {info.key: info.size for info in store.list("")}
    assert sizes == {key: len(key) for key in keys}


def test_delete(store: Store) -> None:
    store.put_bytes("data/d", b"x")
    store.delete("data/d")
    assert store.head("data/d") is None
    store.delete("data/d")  # deleting a missing key is not an error
    assert store.put_bytes("data/d", b"y") is True
    assert store.get_bytes("data/d") == b"y"


def test_swap_ref_semantics(store: Store) -> None:
    key = "refs/ds/main.json"
    assert store.swap_ref(key, b"missing", "some-token") is False  # expected a value, found none
    assert store.swap_ref(key, b"one", None) is True
    assert store.swap_ref(key, b"again", None) is False  # must not exist any more
    first = store.read_ref(key)
    assert first is not None and first.body == b"one"
    assert store.swap_ref(key, b"two", first.token) is True
    assert store.swap_ref(key, b"stale", first.token) is False
    second = store.read_ref(key)
    assert second is not None and second.body == b"two" and second.token != first.token
    assert store.swap_ref(key, b"three", second.token) is True
    assert store.get_bytes(key) == b"three"


def test_concurrent_swappers_win_each_generation_once(store: Store) -> None:
    key, target, workers = "refs/ds/race.json", 12, 4
    wins: list[int] = []
    start = threading.Barrier(workers)

    def swapper(name: int) -> None:
        start.wait()
        while True:
            current = store.read_ref(key)
            generation = int(current.body.split(b":")[0]) if current else 0
            if generation >= target:
                return
            body = f"{generation + 1}:{name}".encode()
            if store.swap_ref(key, body, current.token if current else None):
                wins.append(generation + 1)

    threads = [threading.Thread(target=swapper, args=(name,)) for name in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(wins) == Counter(range(1, target + 1))
    final = store.read_ref(key)
    assert final is not None and final.body.startswith(f"{target}:".encode())


@given(start=st.integers(0, 5000), length=st.integers(1, 5000))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_get_range_matches_slicing(store: Store, start: int, length: int) -> None:
    data = bytes(i * 7 % 251 for i in range(4096))
    store.put_bytes("data/h", data)  # the same bytes every example: create-only keeps the first
    assert store.get_range("data/h", start, length) == data[start : start + length]


def test_removing_an_empty_folder_keeps_every_key(store: Store) -> None:
    store.put_bytes("runs/a/1.json", b"1")
    store.put_bytes("runs/b/1.json", b"2")
    store.delete("runs/b/1.json")
    for prefix in ("runs/a/", "runs/b/", "runs/never/"):  # holding a key, emptied, never made
        store.remove_empty_folder(prefix)
    assert [info.key for info in store.list("runs/")] == ["runs/a/1.json"]
    assert store.get_bytes("runs/a/1.json") == b"1"
    store.put_bytes("runs/b/2.json", b"3")  # a removed folder is made again by the next write
    assert store.get_bytes("runs/b/2.json") == b"3"
    if isinstance(store, LocalStore):
        assert sorted(path.name for path in (store.root / "runs").iterdir()) == ["a", "b"]
        store.delete("runs/b/2.json")
        store.remove_empty_folder("runs/b/")
        assert not (store.root / "runs" / "b").exists()
