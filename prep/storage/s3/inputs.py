"""Input corpora on S3: list the objects a URL, prefix or glob names, and read each one pinned
to the version that was listed (or first read), so an input never changes under a build."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import BinaryIO

from botocore.exceptions import ClientError

from prep.errors import InputError
from prep.storage.s3.client import (
    DEFAULT_JOBS,
    DEFAULT_MAX_ATTEMPTS,
    MIB,
    MISSING_KEY,
    ClientCache,
    error_code,
    s3_errors,
    split_url,
)
from prep.storage.s3.reads import content_length, list_pages, pin, reader, version_of

HASH_CHUNK = 4 * MIB


@dataclass(frozen=True)
class S3Object:
    """One input object found by `list_objects`; `version_id` pins reads when the bucket has one."""

    url: str
    bucket: str
    key: str
    size: int
    etag: str | None = None
    version_id: str | None = None

    @classmethod
    def at(cls, url: str, size: int, etag: str | None = None, version_id: str | None = None) -> S3Object:
        """The object at `s3://bucket/key` as recorded earlier (size, ETag, version)."""
        bucket, key = split_url(url)
        return cls(url, bucket, key, size, etag, version_id)


_INPUT_CLIENTS = ClientCache(DEFAULT_MAX_ATTEMPTS, 2 * DEFAULT_JOBS)


def _head_object(url: str) -> S3Object | None:
    bucket, key = split_url(url)
    with s3_errors(bucket, key):
        try:
            response = _INPUT_CLIENTS.get().head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in MISSING_KEY:
                return None
            raise
    size, etag = content_length(response, bucket, key), response.get("ETag")
    return S3Object(url, bucket, key, size, etag, version_of(response.get("VersionId")))


def list_objects(url: str) -> list[S3Object]:
    """The input objects `url` names, by key: `s3://b/key` (one object, or a folder when no
    such key exists), `s3://b/prefix/` (everything below) or `s3://b/dir/*.jsonl.zst` (a glob)."""
    bucket, key = split_url(url)
    client = _INPUT_CLIENTS.get()
    directory, _, last = key.rpartition("/")
    if any(char in last for char in "*?["):
        prefix = f"{directory}/" if directory else ""
        listed = list_pages(client, bucket, prefix, delimited=True)
        items = [item for item in listed if fnmatchcase(item["Key"][len(prefix) :], last)]
    elif key and not key.endswith("/"):
        single = _head_object(url)
        if single is not None:
            return [single]
        items = list(list_pages(client, bucket, f"{key}/", delimited=False))
    else:
        items = list(list_pages(client, bucket, key, delimited=False))
    found = [
        S3Object(f"s3://{bucket}/{item['Key']}", bucket, item["Key"], int(item["Size"]), item.get("ETag"))
        for item in items
        if not item["Key"].endswith("/")  # folder markers written by consoles
    ]
    if not found:
        raise InputError(f"{url}: no objects match")
    return sorted(found, key=lambda obj: obj.key)


def open_object(obj_or_url: S3Object | str) -> BinaryIO:
    """A streaming, seekable reader of one input object, pinned to the version that was listed."""
    obj = _head_object(obj_or_url) if isinstance(obj_or_url, str) else obj_or_url
    if obj is None:
        raise InputError(f"{obj_or_url}: no such object")
    return reader(_INPUT_CLIENTS.get(), obj.bucket, obj.key, obj.size, pin(obj.version_id, obj.etag))


def hash_object(obj: S3Object, sink: BinaryIO | None = None) -> tuple[S3Object, str]:
    """Read `obj` once (pinned to its listed version or ETag) and return it with the ETag and
    version id that were actually read, and the SHA-256 hex of its bytes; `sink`, if given,
    receives a copy of every byte (the build spools inputs so tasks need not read S3 again).

    Prefix and glob listings report no versions; the first GET does, so later reads of a build
    can stay on exactly the bytes that were hashed, and its log can name that version."""
    client = _INPUT_CLIENTS.get()
    with s3_errors(obj.bucket, obj.key):
        first = client.get_object(Bucket=obj.bucket, Key=obj.key, **pin(obj.version_id, obj.etag))
    if content_length(first, obj.bucket, obj.key) != obj.size:
        first["Body"].close()
        raise InputError(f"{obj.url}: changed since it was listed ({obj.size} -> {first['ContentLength']} bytes)")
    read = replace(obj, etag=first.get("ETag", obj.etag), version_id=version_of(first.get("VersionId")))
    hasher = hashlib.sha256()
    with reader(client, obj.bucket, obj.key, obj.size, pin(read.version_id, read.etag), first) as stream:
        while chunk := stream.read(HASH_CHUNK):
            hasher.update(chunk)
            if sink is not None:
                sink.write(chunk)
    return read, hasher.hexdigest()
