"""Reading S3 objects: seekable streams that survive dropped connections, ranged reads, parallel
downloads, listings, and pinning every request of one read to a single object version."""

from __future__ import annotations

import hashlib
import io
import os
import re
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from botocore.exceptions import ClientError, IncompleteReadError

from prep.errors import StoreError
from prep.storage.parallel import in_sequence
from prep.storage.s3.client import (
    DEFAULT_MAX_ATTEMPTS,
    MIB,
    error_code,
    is_stream_error,
    retry,
    s3_errors,
)

T = TypeVar("T")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class ObjectReader(io.RawIOBase):
    """Streams one S3 object, reopening with a ranged GET after a seek or a dropped connection."""

    def __init__(self, get: Callable[..., dict[str, Any]], bucket: str, key: str, size: int,
                 pin: dict[str, str], first: dict[str, Any] | None, attempts: int) -> None:
        super().__init__()
        self._get, self._bucket, self._key, self._size = get, bucket, key, size
        self._pin, self._attempts, self._pos = pin, attempts, 0
        self._body: Any = first["Body"] if first else None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        if base + offset != self._pos:
            self._drop_body()
            self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self._size - self._pos)
        if wanted <= 0:
            return 0
        with s3_errors(self._bucket, self._key):  # a stream that keeps breaking, once retries run out
            chunk: bytes = retry(lambda: self._read_body(wanted), self._reopen_on_stream_error, self._attempts)
        view[: len(chunk)] = chunk
        self._pos += len(chunk)
        if self._pos == self._size:
            self._end_body()
        return len(chunk)

    def _end_body(self) -> None:
        """Read the body's end: only then does botocore compare a whole-object GET with the
        checksum S3 sent, so damaged bytes fail the last read instead of passing unseen."""
        with s3_errors(self._bucket, self._key):
            extra = self._body.read(1) if self._body is not None else b""
        if extra:
            raise StoreError(f"s3://{self._bucket}/{self._key}: object is longer than its {self._size} bytes")

    def _read_body(self, wanted: int) -> bytes:
        if self._body is None:
            with s3_errors(self._bucket, self._key):
                ranged = {"Range": f"bytes={self._pos}-", **self._pin}
                response = self._get(Bucket=self._bucket, Key=self._key, **ranged)
            check_range(response, self._bucket, self._key, self._pos, self._size - self._pos)
            self._body = response["Body"]
        data = bytes(self._body.read(wanted))
        if not data:  # the body ended before the object (no Content-Length told): reopened from here
            raise IncompleteReadError(actual_bytes=self._pos, expected_bytes=self._size)
        return data

    def _reopen_on_stream_error(self, exc: Exception) -> bool:
        self._drop_body()
        return is_stream_error(exc)

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


def content_length(response: dict[str, Any], bucket: str, key: str, *also: str) -> int:
    """The size a whole-object GET or a HEAD announced; refuses an answer without it, or without
    the other fields `also` names (an endpoint that is not S3, or a proxy that drops headers)."""
    missing = [field for field in ("ContentLength", *also) if field not in response]
    if missing:
        if "Body" in response:
            response["Body"].close()
        raise StoreError(f"s3://{bucket}/{key}: the S3 endpoint's answer has no {' or '.join(missing)}")
    return int(response["ContentLength"])


def check_range(response: dict[str, Any], bucket: str, key: str, start: int, length: int) -> int:
    """The byte count of the answer to a GET of `length` bytes from `start` (fewer at the end);
    refuses an answer that does not start at `start` (an endpoint or proxy that ignores Range sends
    the whole object) or that holds more or fewer bytes than asked for (its end ignored)."""
    content_range = str(response.get("ContentRange") or "")
    match = _CONTENT_RANGE.fullmatch(content_range)
    if match is None or int(match[1]) != start:
        response["Body"].close()
        got = content_range or "the whole object"
        raise StoreError(f"s3://{bucket}/{key}: the S3 endpoint ignored the Range of a GET from byte {start} "
                         f"(sent {got})")
    count = max(0, min(length, int(match[3]) - start))
    if int(match[2]) != start + count - 1 or int(response.get("ContentLength", count)) != count:
        response["Body"].close()
        raise StoreError(f"s3://{bucket}/{key}: the S3 endpoint answered a GET of bytes {start}-{start + length - 1} "
                         f"with {content_range} ({response.get('ContentLength')} bytes)")
    return count


def read_body(response: dict[str, Any], count: int) -> bytes:
    """Exactly the `count` bytes of a checked ranged answer; never more (memory stays bounded)."""
    body = response["Body"]
    try:
        data = bytes(body.read(count))
    finally:
        body.close()
    if len(data) != count:  # a body cut short without a Content-Length to tell: retried like one
        raise IncompleteReadError(actual_bytes=len(data), expected_bytes=count)
    return data


def list_pages(client: Any, bucket: str, prefix: str, delimited: bool) -> Iterator[dict[str, Any]]:
    """Every listed object below `prefix` (only one level deep when `delimited`), page by page."""
    extra = {"Delimiter": "/"} if delimited else {}
    with s3_errors(bucket, prefix):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **extra):
            yield from page.get("Contents", [])


def version_of(version_id: str | None) -> str | None:
    """A real version id, or None (S3 reports "null" for objects written while unversioned)."""
    return None if version_id in (None, "null") else version_id


def pin(version_id: str | None, etag: str | None) -> dict[str, str]:
    """GET arguments that keep every request of one read on the same object version."""
    if version_id:
        return {"VersionId": version_id}
    return {"IfMatch": etag} if etag else {}


def reader(client: Any, bucket: str, key: str, size: int, pinned: dict[str, str],
           first: dict[str, Any] | None = None, attempts: int = DEFAULT_MAX_ATTEMPTS) -> BinaryIO:
    """A buffered, seekable stream of `key`; `first` is an already started GET of byte 0 on."""
    raw = ObjectReader(client.get_object, bucket, key, size, pinned, first, attempts)
    return io.BufferedReader(raw, buffer_size=MIB)


def read_range(client: Any, bucket: str, key: str, start: int, length: int, pinned: dict[str, str],
               attempts: int = DEFAULT_MAX_ATTEMPTS) -> bytes:
    """`length` bytes from `start` (fewer at the end), retrying a body that breaks off."""

    if start < 0:
        raise StoreError(f"s3://{bucket}/{key}: negative read offset {start}")

    def fetch() -> bytes:
        with s3_errors(bucket, key):
            try:
                ranged = {"Range": f"bytes={start}-{start + length - 1}", **pinned}
                response = client.get_object(Bucket=bucket, Key=key, **ranged)
            except ClientError as exc:
                if error_code(exc) == "InvalidRange":  # the object exists but ends before `start`
                    return b""
                raise
        count = check_range(response, bucket, key, start, length)
        return read_body(response, count)  # outside the translation: retry must see stream errors

    with s3_errors(bucket, key):  # a body that keeps breaking off, once retries run out
        return retry(fetch, is_stream_error, attempts)


def download(client: Any, bucket: str, key: str, size: int, pinned: dict[str, str], dest: Path,
             step: int, jobs: int, check: Callable[[str], None], attempts: int = DEFAULT_MAX_ATTEMPTS) -> str:
    """Fetch `size` bytes of `key` into `dest` with up to `jobs` ranged GETs of `step` bytes at
    once; hashes in order into a temporary name beside `dest`, renamed only when complete and
    `check` (given the SHA-256 hex) did not raise. Returns the SHA-256 hex of the bytes."""
    fetches = (partial(read_range, client, bucket, key, start, step, pinned, attempts) for start in range(0, size, step))
    temp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
    hasher, written = hashlib.sha256(), 0
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(temp, "wb") as out:
            for chunk in in_sequence(fetches, jobs, "prep-s3"):
                out.write(chunk)
                hasher.update(chunk)
                written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        if written != size:
            raise StoreError(f"s3://{bucket}/{key}: got {written} of {size} bytes")
        check(hasher.hexdigest())
        os.replace(temp, dest)
    except OSError as exc:
        raise StoreError(f"{dest}: cannot write: {exc.strerror or exc}") from None
    finally:
        temp.unlink(missing_ok=True)
    return hasher.hexdigest()
