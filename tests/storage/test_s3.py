"""S3Store beyond the shared contract: multipart, integrity metadata, races, retries, downloads."""

from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import random
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from prep.errors import IntegrityError, NotFoundError, StoreError
from prep.storage import open_store
from prep.storage.s3 import MIB, MIN_PART_SIZE, S3Settings, S3Store
from prep.store.cas import object_key
from tests.s3support import Fault, RequestHook, admin_client

MULTIPART = S3Settings(multipart_threshold=MIB, part_size=MIN_PART_SIZE, jobs=3)


def random_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def content_key(data: bytes) -> str:
    return object_key(hashlib.sha256(data).hexdigest())


def split(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def on_request(method: str, key: str, query: str = "", fault: Fault | None = None,
               action: Callable[[], None] | None = None, times: int = 1) -> tuple[RequestHook, list[str]]:
    """A hook acting on the first `times` requests `method .../key?...query...`; and its hit log."""
    hits: list[str] = []

    def hook(environ: dict[str, Any]) -> Fault | None:
        if environ["REQUEST_METHOD"] != method or not environ["PATH_INFO"].endswith(f"/{key}"):
            return None
        if query not in environ.get("QUERY_STRING", ""):
            return None
        hits.append(environ.get("QUERY_STRING", ""))
        if len(hits) > times:
            return None
        if action is not None:
            action()
        return fault

    return hook, hits


def uploads_in_progress(bucket: str) -> list[Any]:
    return list(admin_client().list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def test_multipart_put_records_sha256_and_is_create_only(
    s3_bucket: str, tmp_path: Path, s3_request_hooks: list[RequestHook]
) -> None:
    store = S3Store(s3_bucket, MULTIPART)
    data = random_bytes(2 * MIN_PART_SIZE + 123)
    key = content_key(data)
    assert store.put_bytes(key, data) is True
    bucket, _ = split(s3_bucket)
    assert admin_client().head_object(Bucket=bucket, Key=key)["ETag"].endswith('-3"')  # three parts
    assert store.get_bytes(key) == data
    assert store.head_sha256(key) == hashlib.sha256(data).hexdigest()

    hook, hits = on_request("POST", key, "uploads")
    s3_request_hooks.append(hook)
    assert store.put_bytes(key, data) is False
    assert hits == []  # the existing object was seen first: no upload was even started

    other = tmp_path / "other.bin"
    other.write_bytes(random_bytes(MIN_PART_SIZE + 10, seed=1))
    assert store.put_file("data/other.bin", other) is True
    assert store.get_bytes("data/other.bin") == other.read_bytes()
    assert store.head_sha256("data/other.bin") is None  # not a content key
    with pytest.raises(NotFoundError):
        store.head_sha256("data/missing")


def test_single_put_records_sha256(s3_bucket: str) -> None:
    store = S3Store(s3_bucket)
    data = b"small content object"
    assert store.put_bytes(content_key(data), data)
    assert store.head_sha256(content_key(data)) == hashlib.sha256(data).hexdigest()


def test_lost_multipart_completion_returns_false_and_keeps_original(
    s3_bucket: str, s3_request_hooks: list[RequestHook]
) -> None:
    bucket, _ = split(s3_bucket)
    store = S3Store(s3_bucket, MULTIPART)

    def competing_writer() -> None:
        admin_client().put_object(Bucket=bucket, Key="data/big", Body=b"the original")

    hook, hits = on_request("PUT", "data/big", "partNumber=1", action=competing_writer)
    s3_request_hooks.append(hook)
    assert store.put_bytes("data/big", random_bytes(MIN_PART_SIZE + 5)) is False
    assert hits  # the other writer really came in between the check and the completion
    assert store.get_bytes("data/big") == b"the original"
    assert uploads_in_progress(bucket) == []


@pytest.mark.parametrize("size", [100, MIN_PART_SIZE + 1])
def test_content_not_matching_its_key_is_refused(s3_bucket: str, size: int) -> None:
    store = S3Store(s3_bucket, MULTIPART)
    key = object_key("0" * 64)
    with pytest.raises(IntegrityError, match="not to the key's name"):
        store.put_bytes(key, random_bytes(size))
    assert store.head(key) is None
    assert uploads_in_progress(split(s3_bucket)[0]) == []


@pytest.mark.parametrize("size", [1000, MIN_PART_SIZE + 1])
def test_racing_puts_leave_exactly_one_version(s3_versioned_bucket: str, size: int) -> None:
    store = S3Store(s3_versioned_bucket, MULTIPART)
    data = random_bytes(size)
    key = content_key(data)
    results: list[bool] = []
    start = threading.Barrier(4)

    def put() -> None:
        start.wait()
        results.append(store.put_bytes(key, data))

    threads = [threading.Thread(target=put) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, False, True]
    bucket, _ = split(s3_versioned_bucket)
    versions = admin_client().list_object_versions(Bucket=bucket, Prefix=key).get("Versions", [])
    assert [version["Key"] for version in versions] == [key]
    info = store.head(key)
    assert info is not None and info.version_id == versions[0]["VersionId"]


def test_logs_may_be_overwritten(s3_bucket: str) -> None:
    store = S3Store(s3_bucket)
    assert store.put_bytes("logs/build.txt", b"one") is True
    assert store.put_bytes("logs/build.txt", b"two") is True
    assert store.get_bytes("logs/build.txt") == b"two"
    assert store.put_bytes("refs/ds/x.json", b"ref") is True
    assert store.put_bytes("refs/ds/x.json", b"other") is False  # refs are never blindly replaced


def test_throttling_and_conflicts_are_retried(s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    store = S3Store(s3_bucket)
    slow, slow_hits = on_request("PUT", "data/slow", fault=Fault(503, "SlowDown"))
    busy = Fault(409, "ConditionalRequestConflict")
    conflict, conflict_hits = on_request("PUT", "data/conflict", fault=busy)
    s3_request_hooks.extend([slow, conflict])
    assert store.put_bytes("data/slow", b"x") is True
    assert store.put_bytes("data/conflict", b"y") is True
    assert len(slow_hits) == 2 and len(conflict_hits) == 2
    assert store.get_bytes("data/slow") == b"x" and store.get_bytes("data/conflict") == b"y"


def test_a_write_whose_response_was_lost_still_counts_as_ours(
    s3_bucket: str, s3_request_hooks: list[RequestHook]
) -> None:
    store = S3Store(s3_bucket)
    lost = Fault(500, "InternalError", after_handling=True)
    hits: list[list[str]] = []
    for key in ("data/lost", "refs/ds/lost.json"):
        hook, key_hits = on_request("PUT", key, fault=lost)
        s3_request_hooks.append(hook)
        hits.append(key_hits)
    assert store.put_bytes("data/lost", b"mine") is True  # the retry met 412 from our own write
    assert store.swap_ref("refs/ds/lost.json", b"gen 1", None) is True
    assert [len(key_hits) for key_hits in hits] == [2, 2]
    assert store.put_bytes("data/lost", b"mine") is False  # an honest second put still loses
    assert store.swap_ref("refs/ds/lost.json", b"gen 1", None) is False


def test_download_file_in_parallel_ranges(
    s3_bucket: str, tmp_path: Path, s3_request_hooks: list[RequestHook]
) -> None:
    store = S3Store(s3_bucket, MULTIPART)
    data = random_bytes(2 * MIN_PART_SIZE + 4321)  # every range is longer than the 1000-byte cut, whichever comes first
    store.put_bytes("data/blob", data)
    broken, hits = on_request("GET", "data/blob", fault=Fault(200, truncate=1000))
    s3_request_hooks.append(broken)  # one range breaks off mid-body and must be fetched again
    dest = tmp_path / "out" / "blob.bin"
    assert store.download_file("data/blob", dest, jobs=3) == hashlib.sha256(data).hexdigest()
    assert dest.read_bytes() == data
    assert len(hits) == 4 and sorted(path.name for path in dest.parent.iterdir()) == ["blob.bin"]
    with pytest.raises(NotFoundError):
        store.download_file("data/none", tmp_path / "out" / "none.bin", jobs=2)
    assert sorted(path.name for path in dest.parent.iterdir()) == ["blob.bin"]
    empty = tmp_path / "empty.bin"
    store.put_bytes("data/empty", b"")
    assert store.download_file("data/empty", empty, jobs=2) == hashlib.sha256(b"").hexdigest()


def test_open_survives_a_broken_stream_and_seeks(s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    store = S3Store(s3_bucket)
    data = random_bytes(3 * MIB)
    store.put_bytes("data/stream", data)
    hook, hits = on_request("GET", "data/stream", fault=Fault(200, truncate=10_000))
    s3_request_hooks.append(hook)
    with store.open("data/stream") as stream:
        assert stream.read() == data
        stream.seek(-10, 2)
        assert stream.read() == data[-10:]
    assert len(hits) >= 2


_inherited: list[S3Store] = []


def _read_in_child(store: S3Store | None, key: str) -> bytes:
    return (store or _inherited[0]).get_bytes(key)


def test_pickles_and_works_in_forked_workers(s3_bucket: str) -> None:
    store = S3Store(f"{s3_bucket}/pre", MULTIPART)
    store.put_bytes("k", b"value")  # the parent's client exists before the fork
    clone = pickle.loads(pickle.dumps(store))
    assert (clone.url, clone.settings) == (store.url, store.settings)
    assert clone.get_bytes("k") == b"value"
    _inherited[:] = [store]  # reaches the children through fork, client included
    try:
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
            assert list(pool.map(_read_in_child, [None, store], ["k", "k"])) == [b"value", b"value"]
    finally:
        _inherited.clear()


def test_configuration(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREP_S3_MULTIPART_THRESHOLD", "8MiB")
    store = open_store(f"{s3_bucket}/a/b/")
    assert isinstance(store, S3Store)
    assert store.settings.multipart_threshold == 8 * MIB and store.prefix == "a/b/"
    assert store.url == f"{s3_bucket}/a/b"
    monkeypatch.setenv("PREP_S3_MULTIPART_THRESHOLD", "lots")
    with pytest.raises(StoreError, match="PREP_S3_MULTIPART_THRESHOLD"):
        S3Store.from_url(s3_bucket)
    with pytest.raises(StoreError, match="part size"):
        S3Settings(part_size=MIB)
    for bad in ("s3://", "http://bucket/x"):
        with pytest.raises(StoreError):
            S3Store(bad)
    with pytest.raises(StoreError, match="invalid store key"):
        S3Store(s3_bucket, MULTIPART).put_bytes("a/../b", b"")


def test_prefix_isolates_neighbours_and_staging_is_local(s3_bucket: str) -> None:
    bucket, _ = split(s3_bucket)
    for key in ("p/x", "p2/y", "px"):
        admin_client().put_object(Bucket=bucket, Key=key, Body=b"1")
    store = S3Store(f"{s3_bucket}/p")
    assert [info.key for info in store.list("")] == ["x"]
    staging = store.staging_dir()
    assert staging.is_dir() and store.staging_dir() == staging


def test_a_ref_larger_than_a_ref_value_is_refused_unread(s3_bucket: str) -> None:
    """A ref value is a few hundred bytes: a huge object planted at a ref key is refused by its
    announced length, as the local store refuses it, not read into memory."""
    store = S3Store(s3_bucket)
    assert store.swap_ref("refs/ds/latest.json", b"{" + b" " * (128 << 10) + b"}", None)
    with pytest.raises(IntegrityError, match=r"refs/ds/latest\.json: larger than 65536 bytes"):
        store.read_ref("refs/ds/latest.json")
    assert store.swap_ref("refs/ds/small.json", b"{}", None)
    small = store.read_ref("refs/ds/small.json")
    assert small is not None and small.body == b"{}"
