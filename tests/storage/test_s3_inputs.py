"""Reading input corpora from S3: listing by key, prefix or glob, and pinned streaming reads."""

from __future__ import annotations

import pytest

from prep.errors import InputError, StoreError
from prep.storage.s3 import S3Object, list_objects, open_object
from tests.s3support import admin_client

CORPUS = {
    "corpus/a.jsonl.zst": b"a" * 10,
    "corpus/b.jsonl.zst": b"b" * 20,
    "corpus/c.txt": b"c",
    "corpus/sub/d.jsonl.zst": b"d" * 3,
    "corpus/": b"",  # a folder marker, as S3 consoles create
    "corpus-other/e.jsonl.zst": b"e",
}


def fill(bucket_url: str) -> str:
    bucket = bucket_url.removeprefix("s3://")
    for key, body in CORPUS.items():
        admin_client().put_object(Bucket=bucket, Key=key, Body=body)
    return bucket


def keys(objects: list[S3Object]) -> list[str]:
    return [obj.key for obj in objects]


def test_prefix_glob_and_single_object(s3_bucket: str) -> None:
    bucket = fill(s3_bucket)
    below = ["corpus/a.jsonl.zst", "corpus/b.jsonl.zst", "corpus/c.txt", "corpus/sub/d.jsonl.zst"]
    assert keys(list_objects(f"{s3_bucket}/corpus/")) == below
    assert keys(list_objects(f"{s3_bucket}/corpus")) == below  # no such key: taken as a folder
    assert keys(list_objects(f"{s3_bucket}/corpus/*.jsonl.zst")) == below[:2]
    assert keys(list_objects(f"{s3_bucket}/corpus/[ac].*")) == ["corpus/a.jsonl.zst", "corpus/c.txt"]
    assert len(list_objects(f"{s3_bucket}/")) == len(CORPUS) - 1
    (single,) = list_objects(f"{s3_bucket}/corpus/b.jsonl.zst")
    assert single == S3Object(
        f"{s3_bucket}/corpus/b.jsonl.zst", bucket, "corpus/b.jsonl.zst", 20, single.etag, None
    )
    assert single.etag is not None
    listed = list_objects(f"{s3_bucket}/corpus/b*")
    assert [(obj.url, obj.size, obj.etag) for obj in listed] == [(single.url, 20, single.etag)]


def test_nothing_matches(s3_bucket: str) -> None:
    fill(s3_bucket)
    globbed_folder = f"{s3_bucket}/*/a.jsonl.zst"  # a glob counts in the last component only
    for url in (f"{s3_bucket}/corpus/*.parquet", f"{s3_bucket}/nothing/", f"{s3_bucket}/nothing",
                globbed_folder):
        with pytest.raises(InputError, match="no objects match"):
            list_objects(url)
    with pytest.raises(InputError, match="no such object"):
        open_object(f"{s3_bucket}/corpus/missing.txt")
    with pytest.raises(StoreError, match="not an s3:// URL"):
        list_objects("/local/path")


def test_open_object_streams(s3_bucket: str) -> None:
    fill(s3_bucket)
    with open_object(f"{s3_bucket}/corpus/b.jsonl.zst") as stream:
        assert stream.read(5) == b"bbbbb"
        assert stream.read() == b"b" * 15
    for obj in list_objects(f"{s3_bucket}/corpus/"):
        with open_object(obj) as stream:
            assert stream.read() == CORPUS[obj.key]


def test_reads_stay_on_the_listed_version(s3_bucket: str, s3_versioned_bucket: str) -> None:
    for url in (s3_bucket, s3_versioned_bucket):
        bucket = url.removeprefix("s3://")
        admin_client().put_object(Bucket=bucket, Key="data.txt", Body=b"old")
        (listed,) = list_objects(f"{url}/data.txt")
        admin_client().put_object(Bucket=bucket, Key="data.txt", Body=b"new!")
        if url == s3_versioned_bucket:
            assert listed.version_id is not None
            with open_object(listed) as stream:
                assert stream.read() == b"old"
        else:
            with pytest.raises(StoreError, match="changed while being read"), open_object(listed) as stream:
                stream.read()
        with open_object(f"{url}/data.txt") as stream:
            assert stream.read() == b"new!"
