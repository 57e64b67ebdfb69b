"""S3Store: a store on Amazon S3 or any S3-compatible service, built on conditional writes.

Create-only keys are written with `If-None-Match: *` (single PUT or multipart completion), refs
move with `If-Match: <etag>`, so no key is ever overwritten unconditionally (only `logs/` is).
Configuration (endpoint, credentials, region) comes from the standard AWS environment and files.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from botocore.exceptions import BotoCoreError, ClientError

from prep.errors import IntegrityError, NotFoundError, StoreError
from prep.storage.backend import MAX_REF_BYTES, ObjectInfo, RefValue, Store, too_large
from prep.storage.s3 import staging
from prep.storage.s3.client import (
    DEFAULT_JOBS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    MAX_PUT_SIZE,
    MIN_PART_SIZE,
    MISSING_KEY,
    THRESHOLD_ENV,
    ClientCache,
    error_code,
    is_stream_error,
    parse_size,
    part_size_for,
    retry,
    s3_errors,
    split_url,
    translate,
)
from prep.storage.s3.reads import (
    content_length,
    download,
    list_pages,
    pin,
    read_range,
    reader,
    version_of,
)
from prep.storage.s3.uploads import (
    CREATE_ONLY,
    Upload,
    is_completion_conflict,
    put_multipart,
    put_ref,
    put_single,
)

OVERWRITABLE_PREFIX = "logs/"
CONTENT_PREFIX = "objects/sha256/"
SHA256_METADATA = "sha256"  # sent as x-amz-meta-sha256


def addressable(key: str) -> bool:
    """Whether requests may name `key`: not empty, not absolute, no `..` segment."""
    return bool(key) and not key.startswith("/") and ".." not in key.split("/")


@dataclass(frozen=True)
class S3Settings:
    """Tuning of an S3Store; pickled along with its URL."""

    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD
    part_size: int = DEFAULT_PART_SIZE
    jobs: int = DEFAULT_JOBS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if not MIN_PART_SIZE <= self.part_size <= MAX_PUT_SIZE:
            raise StoreError(f"S3 part size {self.part_size} is outside {MIN_PART_SIZE}..{MAX_PUT_SIZE} bytes")
        if self.multipart_threshold < 1 or self.jobs < 1 or self.max_attempts < 1:
            raise StoreError("S3 multipart threshold, jobs and attempts must be positive")


class S3Store(Store):
    """Keys live below `s3://bucket/prefix/`; one client per process, shared by its threads."""

    def __init__(self, url: str, settings: S3Settings | None = None) -> None:
        self.bucket, prefix = split_url(url)
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.url = f"s3://{self.bucket}/{prefix}".rstrip("/")
        if settings is None:
            threshold = os.environ.get(THRESHOLD_ENV)
            settings = S3Settings(parse_size(threshold, THRESHOLD_ENV)) if threshold else S3Settings()
        self.settings = settings
        self._clients = ClientCache(settings.max_attempts, max(10, 2 * settings.jobs))
        self._bucket_checked = False

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        """The store at `s3://bucket/prefix`, tuned by PREP_S3_MULTIPART_THRESHOLD if set."""
        return cls(url)

    def __getstate__(self) -> dict[str, object]:
        return {"url": self.url, "settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["settings"])  # type: ignore[misc]

    def _client(self) -> Any:
        return self._clients.get()

    def _full(self, key: str) -> str:
        if not addressable(key):
            raise StoreError(f"invalid store key {key!r}")
        return self.prefix + key

    def _errors(self, key: str) -> AbstractContextManager[None]:
        return s3_errors(self.bucket, self.prefix + key)

    def _check_content(self, key: str, actual_sha256: str) -> None:
        """Refuse content-object bytes, to be stored or just read, that do not hash to the key's name."""
        if key.startswith(CONTENT_PREFIX) and actual_sha256 != key.rsplit("/", 1)[-1]:
            raise IntegrityError(f"{self.url}/{key}: bytes hash to sha256:{actual_sha256}, not to the key's name")

    def _upload(self, key: str) -> Upload:
        """How `key` is written: create-only outside `logs/`; content objects carry their sha256."""
        metadata = {SHA256_METADATA: key.rsplit("/", 1)[-1]} if key.startswith(CONTENT_PREFIX) else {}
        condition = {} if key.startswith(OVERWRITABLE_PREFIX) else CREATE_ONLY
        return Upload(self._client(), self.bucket, self._full(key), metadata, condition)

    def _is_multipart(self, size: int) -> bool:
        """Whether `size` bytes go up in parts: from the threshold on, and always above S3's
        limit for a single PUT."""
        return size >= min(self.settings.multipart_threshold, MAX_PUT_SIZE + 1)

    def put_bytes(self, key: str, data: bytes) -> bool:
        if self._is_multipart(len(data)):
            return self._put_multipart(key, io.BytesIO(data), len(data))
        return self._put_single(key, data)

    def put_file(self, key: str, path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if self._is_multipart(size):
                    return self._put_multipart(key, handle, size)
                data = handle.read()
        except OSError as exc:
            raise StoreError(f"{path}: cannot read: {exc.strerror or exc}") from None
        return self._put_single(key, data)

    def _put_single(self, key: str, data: bytes) -> bool:
        upload = self._upload(key)
        if upload.metadata:
            self._check_content(key, hashlib.sha256(data).hexdigest())
        return put_single(upload, data, self.settings.max_attempts)

    def _put_multipart(self, key: str, source: BinaryIO, size: int) -> bool:
        """A multipart upload of the `size` bytes of `source` from its start, started over when
        its completion met a conflicting write (409) and the key is still free."""
        upload = self._upload(key)
        check = partial(self._check_content, key)
        part_size = part_size_for(size, self.settings.part_size)

        def attempt() -> bool:
            if upload.condition and self.head(key) is not None:
                return False  # spare the upload; the conditional completion stays the real guard
            source.seek(0)
            return put_multipart(upload, source, part_size, self.settings.jobs, check)

        return retry(attempt, is_completion_conflict, self.settings.max_attempts)

    def open(self, key: str) -> BinaryIO:
        full = self._full(key)
        client = self._client()
        with self._errors(key):
            first = client.get_object(Bucket=self.bucket, Key=full)
        size, pinned = content_length(first, self.bucket, full), pin(None, first.get("ETag"))
        return reader(client, self.bucket, full, size, pinned, first, self.settings.max_attempts)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            self.require(key)
            return b""
        return read_range(self._client(), self.bucket, self._full(key), start, length, {}, self.settings.max_attempts)

    def download_file(self, key: str, dest: Path, jobs: int = DEFAULT_JOBS) -> str:
        """Fetch `key` into `dest` with parallel ranged GETs; returns the sha256 hex of the bytes.

        Writes a temporary name beside `dest`, hashing in order, and renames only when complete
        (and, for a content object, when the bytes hash to the key's name: else IntegrityError)."""
        info = self.require(key)
        return download(self._client(), self.bucket, self._full(key), info.size, pin(None, info.etag), dest,
                        self.settings.part_size, jobs, partial(self._check_content, key), self.settings.max_attempts)

    def _head(self, key: str) -> dict[str, Any] | None:
        with self._errors(key):
            try:
                response: dict[str, Any] = self._client().head_object(Bucket=self.bucket, Key=self._full(key))
                return response
            except ClientError as exc:
                if error_code(exc) not in MISSING_KEY:
                    raise
        self._check_bucket()  # a HEAD answers a bare 404 for a missing bucket too
        return None

    def _check_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            self._client().head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if error_code(exc) in {"404", "NoSuchBucket", "NotFound"}:
                raise StoreError(f"s3://{self.bucket}: bucket does not exist") from None
            if error_code(exc) != "403":  # no ListBucket right: cannot tell, assume it exists
                raise translate(exc, self.bucket, "") from None
        except BotoCoreError as exc:
            raise translate(exc, self.bucket, "") from None
        self._bucket_checked = True

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head(key)
        if response is None:
            return None
        return ObjectInfo(
            key=key,
            size=content_length(response, self.bucket, self._full(key), "LastModified"),
            mtime=response["LastModified"].timestamp(),
            etag=response.get("ETag"),
            version_id=version_of(response.get("VersionId")),
        )

    def head_sha256(self, key: str) -> str | None:
        """The SHA-256 recorded when a content object was stored (None if none was); one HEAD."""
        response = self._head(key)
        if response is None:
            raise NotFoundError(f"{self.url}/{key}: no such key")
        value = response.get("Metadata", {}).get(SHA256_METADATA)
        return str(value) if value else None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        previous = ""
        for item in list_pages(self._client(), self.bucket, self.prefix + prefix, delimited=False):
            key = item["Key"][len(self.prefix) :]
            if key < previous:  # S3 lists in UTF-8 order; some compatible stores do not
                raise StoreError(f"{self.url}: the endpoint does not list keys in order")
            previous = key
            if not addressable(key):  # not prep's (`a/../b`): no request may name it, a proxy could resolve it
                continue
            yield ObjectInfo(key, int(item["Size"]), item["LastModified"].timestamp(), item.get("ETag"))

    def delete(self, key: str) -> None:
        with self._errors(key):
            self._client().delete_object(Bucket=self.bucket, Key=self._full(key))

    def read_ref(self, key: str) -> RefValue | None:
        full = self._full(key)

        def fetch() -> RefValue | None:
            with self._errors(key):
                try:
                    response = self._client().get_object(Bucket=self.bucket, Key=full)
                except ClientError as exc:
                    if error_code(exc) not in MISSING_KEY:
                        raise
                    return None
            # without a length, a body that ended early would pass
            if content_length(response, self.bucket, full) > MAX_REF_BYTES:
                response["Body"].close()
                raise too_large(f"{self.url}/{key}", MAX_REF_BYTES)
            return RefValue(bytes(response["Body"].read()), str(response["ETag"]))  # untranslated: retry sees a break

        with self._errors(key):  # a body that keeps breaking off, once retries run out
            return retry(fetch, is_stream_error, self.settings.max_attempts)

    def swap_ref(self, key: str, body: bytes, expected: str | None) -> bool:
        condition = CREATE_ONLY if expected is None else {"IfMatch": expected}
        return put_ref(Upload(self._client(), self.bucket, self._full(key), {}, condition), body)

    def staging_dir(self) -> Path:
        """A private temporary folder of this process, removed when the process exits (or, if it
        never gets to, by a later process of this host: prep.storage.s3.staging)."""
        return staging.process_folder()
