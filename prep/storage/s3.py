"""A store on Amazon S3 or any S3-compatible service, built on conditional writes.

Create-only keys are written with `If-None-Match: *` (single PUT or multipart completion), refs
move with `If-Match: <etag>`, so no key is ever overwritten unconditionally (only `logs/` is).
This is the only module of prep that imports boto3/botocore. Configuration (endpoint,
credentials, region) comes from the standard AWS environment and files.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from functools import cache, partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from prep.errors import InputError, IntegrityError, NotFoundError, PrepError, StoreError
from prep.storage.base import ObjectInfo, RefValue, Store

MIB = 1 << 20
MIN_PART_SIZE = 5 * MIB  # S3's minimum for every part but the last
DEFAULT_MULTIPART_THRESHOLD = 64 * MIB
DEFAULT_PART_SIZE = 16 * MIB
DEFAULT_JOBS = 8
DEFAULT_MAX_ATTEMPTS = 8
THRESHOLD_ENV = "PREP_S3_MULTIPART_THRESHOLD"
OVERWRITABLE_PREFIX = "logs/"
CONTENT_PREFIX = "objects/sha256/"
SHA256_METADATA = "sha256"  # sent as x-amz-meta-sha256

_LOST_RACE = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING_KEY = {"NoSuchKey", "404", "NotFound"}
_BAD_CREDENTIALS = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "InvalidClientTokenId", "AuthorizationHeaderMalformed",
}
_DENIED = {"AccessDenied", "AllAccessDisabled"}
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError)
_STREAM_ERRORS = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError, ConnectionClosedError)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": MIB, "mib": MIB, "g": 1 << 30, "gib": 1 << 30}

T = TypeVar("T")


def split_url(url: str) -> tuple[str, str]:
    """The bucket and the key (or key prefix) of an `s3://bucket/key` URL."""
    if not url.startswith("s3://"):
        raise StoreError(f"{url}: not an s3:// URL")
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise StoreError(f"{url}: S3 URL names no bucket")
    return bucket, key


def parse_size(text: str, name: str) -> int:
    """A byte count such as `67108864`, `64MiB` or `64m`; `name` is used in the error."""
    stripped = text.strip().lower()
    digits = stripped.rstrip("kmgib")
    unit = stripped[len(digits) :]
    if not digits.isdigit() or unit not in _SIZE_UNITS:
        raise StoreError(f"{name}={text!r}: not a byte count (e.g. 67108864 or 64MiB)")
    return int(digits) * _SIZE_UNITS[unit]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _translate(exc: Exception, bucket: str, key: str) -> PrepError:
    """One-line PrepError for a botocore failure on `s3://bucket/key`."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    if isinstance(exc, ClientError):
        code = _code(exc)
        if code == "NoSuchBucket":
            return StoreError(f"s3://{bucket}: bucket does not exist")
        if code in _MISSING_KEY:
            return NotFoundError(f"{where}: no such key")
        if code in {"PreconditionFailed", "412"}:  # only reads get here: writes handle their own
            return StoreError(f"{where}: object changed while being read")
        if code in _BAD_CREDENTIALS:
            return StoreError(f"{where}: credentials rejected by the S3 endpoint ({code})")
        if code == "403":  # a HEAD's error has no body to tell the two apart
            return StoreError(f"{where}: access denied or credentials rejected (HTTP 403)")
        if code in _DENIED:
            return StoreError(f"{where}: access denied")
        message = exc.response.get("Error", {}).get("Message", "")
        return StoreError(f"{where}: S3 {exc.operation_name} failed: {code} {_one_line(message)}")
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StoreError(f"{where}: no usable AWS credentials (set AWS_ACCESS_KEY_ID or AWS_PROFILE)")
    if isinstance(exc, _UNREACHABLE):
        return StoreError(f"{where}: cannot reach the S3 endpoint ({_one_line(str(exc))})")
    return StoreError(f"{where}: {_one_line(str(exc))}")


@contextmanager
def _s3_errors(bucket: str, key: str) -> Iterator[None]:
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise _translate(exc, bucket, key) from None


def _retry(call: Callable[[], T], retryable: Callable[[Exception], bool], attempts: int) -> T:
    """Run `call`, retrying what `retryable` accepts with exponential backoff and full jitter.

    botocore already retries throttling and 5xx; this covers what it leaves alone (409 conflicts
    on conditional writes, connections dropped while a body streams)."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:
            if attempt + 1 >= attempts or not retryable(exc):
                raise
            time.sleep(random.uniform(0.0, min(5.0, 0.05 * 2**attempt)))
    raise AssertionError("unreachable")


def _was_retried(exc: ClientError) -> bool:
    """True when botocore re-sent the request, so an earlier attempt may have taken effect."""
    return bool(exc.response.get("ResponseMetadata", {}).get("RetryAttempts"))


def _is_conflict(exc: Exception) -> bool:
    return isinstance(exc, ClientError) and _code(exc) in {"ConditionalRequestConflict", "409"}


def _is_stream_error(exc: Exception) -> bool:
    return isinstance(exc, _STREAM_ERRORS)


_client_lock = threading.Lock()


def _reset_lock_after_fork() -> None:
    global _client_lock
    _client_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_after_fork)


@cache
def _shared_loader() -> Any:
    return botocore.session.get_session().get_component("data_loader")


@dataclass
class _ClientCache:
    """One boto3 client per process: clients are thread-safe but must not cross a fork."""

    max_attempts: int
    pool_size: int
    _entry: tuple[int, Any] | None = field(default=None, repr=False)

    def get(self) -> Any:
        entry = self._entry
        if entry is None or entry[0] != os.getpid():
            with _client_lock:
                entry = self._entry
                if entry is None or entry[0] != os.getpid():
                    entry = (os.getpid(), self._new_client())
                    self._entry = entry
        return entry[1]

    def _new_client(self) -> Any:
        mode = "adaptive" if os.environ.get("AWS_RETRY_MODE") == "adaptive" else "standard"
        retries = {"mode": mode, "total_max_attempts": self.max_attempts}
        config = Config(retries=retries, max_pool_connections=self.pool_size)
        try:  # a fresh session reads the AWS environment now, not when boto3 was first used
            core = botocore.session.get_session()
            core.register_component("data_loader", _shared_loader())  # parsed API models are reused
            return boto3.session.Session(botocore_session=core).client("s3", config=config)
        except BotoCoreError as exc:
            raise StoreError(f"S3 configuration: {_one_line(str(exc))}") from None


class _ObjectReader(io.RawIOBase):
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
        chunk: bytes = _retry(lambda: self._read_body(wanted), self._reopen_on_stream_error, self._attempts)
        if not chunk:
            raise StoreError(f"s3://{self._bucket}/{self._key}: object ended early at byte {self._pos}")
        view[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)

    def _read_body(self, wanted: int) -> bytes:
        if self._body is None:
            with _s3_errors(self._bucket, self._key):
                ranged = {"Range": f"bytes={self._pos}-", **self._pin}
                response = self._get(Bucket=self._bucket, Key=self._key, **ranged)
            self._body = response["Body"]
        return bytes(self._body.read(wanted))

    def _reopen_on_stream_error(self, exc: Exception) -> bool:
        self._drop_body()
        return _is_stream_error(exc)

    def _drop_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


def _in_order(tasks: Iterator[Callable[[], T]], jobs: int) -> Iterator[T]:
    """Run up to `jobs` tasks at once in threads, yielding their results in task order."""
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="prep-s3")
    pending: deque[Future[T]] = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) >= jobs:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _list_pages(client: Any, bucket: str, prefix: str, delimited: bool) -> Iterator[dict[str, Any]]:
    """Every listed object below `prefix` (only one level deep when `delimited`), page by page."""
    extra = {"Delimiter": "/"} if delimited else {}
    with _s3_errors(bucket, prefix):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **extra):
            yield from page.get("Contents", [])


def _version(version_id: str | None) -> str | None:
    return None if version_id in (None, "null") else version_id  # "null": written while unversioned


def _pin(version_id: str | None, etag: str | None) -> dict[str, str]:
    """GET arguments that keep every request of one read on the same object version."""
    if version_id:
        return {"VersionId": version_id}
    return {"IfMatch": etag} if etag else {}


def _reader(client: Any, bucket: str, key: str, size: int, pin: dict[str, str],
            first: dict[str, Any] | None = None) -> BinaryIO:
    raw = _ObjectReader(client.get_object, bucket, key, size, pin, first, DEFAULT_MAX_ATTEMPTS)
    return io.BufferedReader(raw, buffer_size=MIB)


def _read_range(client: Any, bucket: str, key: str, start: int, length: int, pin: dict[str, str]) -> bytes:
    """`length` bytes from `start` (fewer at the end), retrying a body that breaks off."""

    def fetch() -> bytes:
        with _s3_errors(bucket, key):
            try:
                ranged = {"Range": f"bytes={start}-{start + length - 1}", **pin}
                response = client.get_object(Bucket=bucket, Key=key, **ranged)
            except ClientError as exc:
                if _code(exc) == "InvalidRange":  # the object exists but ends before `start`
                    return b""
                raise
        return bytes(response["Body"].read())  # outside the translation: _retry must see stream errors

    return _retry(fetch, _is_stream_error, DEFAULT_MAX_ATTEMPTS)



@dataclass(frozen=True)
class S3Settings:
    """Tuning of an S3Store; pickled along with its URL."""

    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD
    part_size: int = DEFAULT_PART_SIZE
    jobs: int = DEFAULT_JOBS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if self.part_size < MIN_PART_SIZE:
            raise StoreError(f"S3 part size {self.part_size} is below the minimum of {MIN_PART_SIZE} bytes")
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
        self._clients = _ClientCache(settings.max_attempts, max(10, 2 * settings.jobs))
        self._bucket_checked = False
        self._staging: tuple[int, Path] | None = None

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
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid store key {key!r}")
        return self.prefix + key

    def _errors(self, key: str) -> Any:
        return _s3_errors(self.bucket, self.prefix + key)

    def _content_metadata(self, key: str, actual_sha256: Callable[[], str]) -> dict[str, str]:
        """x-amz-meta-sha256 for a content object, after proving its bytes match the key's name."""
        if not key.startswith(CONTENT_PREFIX):
            return {}
        expected = key.rsplit("/", 1)[-1]
        actual = actual_sha256()
        if actual != expected:
            raise IntegrityError(f"{self.url}/{key}: bytes hash to sha256:{actual}, not to the key's name")
        return {SHA256_METADATA: expected}

    def _create_condition(self, key: str) -> dict[str, str]:
        return {} if key.startswith(OVERWRITABLE_PREFIX) else {"IfNoneMatch": "*"}

    def put_bytes(self, key: str, data: bytes) -> bool:
        if len(data) >= self.settings.multipart_threshold:
            return self._put_multipart(key, io.BytesIO(data))
        return self._put_single(key, data)

    def put_file(self, key: str, path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size >= self.settings.multipart_threshold:
                    return self._put_multipart(key, handle)
                data = handle.read()
        except OSError as exc:
            raise StoreError(f"{path}: cannot read: {exc.strerror or exc}") from None
        return self._put_single(key, data)

    def _put_single(self, key: str, data: bytes) -> bool:
        full = self._full(key)
        metadata = self._content_metadata(key, lambda: hashlib.sha256(data).hexdigest())
        condition = self._create_condition(key)

        def put() -> None:
            self._client().put_object(Bucket=self.bucket, Key=full, Body=data, Metadata=metadata, **condition)

        with self._errors(key):
            try:
                _retry(put, _is_conflict, self.settings.max_attempts)
            except ClientError as exc:
                if _code(exc) in {"PreconditionFailed", "412"}:
                    return _was_retried(exc) and self._holds(key, data)
                raise
        return True

    def _holds(self, key: str, data: bytes) -> bool:
        """Whether `key` holds exactly `data`, judged by its ETag (the MD5 of a single-PUT object
        unless KMS encryption is on); settles a condition that failed only on a retried request."""
        info = self.head(key)
        return info is not None and info.etag == f'"{hashlib.md5(data).hexdigest()}"'

    def _put_multipart(self, key: str, source: BinaryIO) -> bool:
        """Upload parts in parallel threads; complete create-only, aborting on any failure."""
        full = self._full(key)
        condition = self._create_condition(key)
        if condition and self.head(key) is not None:
            return False  # spare the upload; the conditional completion stays the real guard
        client = self._client()
        metadata = {SHA256_METADATA: key.rsplit("/", 1)[-1]} if key.startswith(CONTENT_PREFIX) else {}
        with self._errors(key):
            created = client.create_multipart_upload(Bucket=self.bucket, Key=full, Metadata=metadata)
        upload_id = str(created["UploadId"])
        try:
            parts, actual = self._upload_parts(full, upload_id, source)
            self._content_metadata(key, lambda: actual)
            with self._errors(key):
                try:
                    client.complete_multipart_upload(
                        Bucket=self.bucket, Key=full, UploadId=upload_id,
                        MultipartUpload={"Parts": parts}, **condition,
                    )
                except ClientError as exc:
                    if _code(exc) in _LOST_RACE:
                        self._abort(full, upload_id)
                        return False
                    raise
        except BaseException:
            self._abort(full, upload_id)
            raise
        return True

    def _upload_parts(self, full: str, upload_id: str, source: BinaryIO) -> tuple[list[dict[str, Any]], str]:
        """Read parts in order (hashing them), upload up to `jobs` at once; parts list and sha256."""
        client, hasher = self._client(), hashlib.sha256()

        def upload(number: int, chunk: bytes) -> dict[str, Any]:
            with _s3_errors(self.bucket, full):
                response = client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=chunk
                )
            return {"ETag": response["ETag"], "PartNumber": number}

        def tasks() -> Iterator[Callable[[], dict[str, Any]]]:
            number = 0
            while chunk := source.read(self.settings.part_size):
                hasher.update(chunk)
                number += 1
                yield partial(upload, number, chunk)

        parts = list(_in_order(tasks(), self.settings.jobs))
        return parts, hasher.hexdigest()

    def _abort(self, full: str, upload_id: str) -> None:
        try:
            self._client().abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except (ClientError, BotoCoreError):
            pass  # an orphaned upload only costs storage; a bucket lifecycle rule can reap it

    def open(self, key: str) -> BinaryIO:
        full = self._full(key)
        client = self._client()
        with self._errors(key):
            first = client.get_object(Bucket=self.bucket, Key=full)
        size, pin = int(first["ContentLength"]), _pin(None, first.get("ETag"))
        return _reader(client, self.bucket, full, size, pin, first)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            self.require(key)
            return b""
        return _read_range(self._client(), self.bucket, self._full(key), start, length, {})

    def download_file(self, key: str, dest: Path, jobs: int = DEFAULT_JOBS) -> str:
        """Fetch `key` into `dest` with parallel ranged GETs; returns the sha256 hex of the bytes.

        Writes a temporary name beside `dest`, hashing in order, and renames only when complete."""
        info = self.require(key)
        full, client, pin = self._full(key), self._client(), _pin(None, info.etag)
        step = self.settings.part_size
        starts = range(0, info.size, step)
        fetches = (partial(_read_range, client, self.bucket, full, start, step, pin) for start in starts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        hasher, written = hashlib.sha256(), 0
        try:
            with open(temp, "wb") as out:
                for chunk in _in_order(fetches, jobs):
                    out.write(chunk)
                    hasher.update(chunk)
                    written += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            if written != info.size:
                raise StoreError(f"{self.url}/{key}: got {written} of {info.size} bytes")
            os.replace(temp, dest)
        except OSError as exc:
            raise StoreError(f"{dest}: cannot write: {exc.strerror or exc}") from None
        finally:
            temp.unlink(missing_ok=True)
        return hasher.hexdigest()

    def _head(self, key: str) -> dict[str, Any] | None:
        with self._errors(key):
            try:
                response: dict[str, Any] = self._client().head_object(Bucket=self.bucket, Key=self._full(key))
                return response
            except ClientError as exc:
                if _code(exc) not in _MISSING_KEY:
                    raise
        self._check_bucket()  # a HEAD answers a bare 404 for a missing bucket too
        return None

    def _check_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            self._client().head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _code(exc) in {"404", "NoSuchBucket", "NotFound"}:
                raise StoreError(f"s3://{self.bucket}: bucket does not exist") from None
            if _code(exc) != "403":  # no ListBucket right: cannot tell, assume it exists
                raise _translate(exc, self.bucket, "") from None
        except BotoCoreError as exc:
            raise _translate(exc, self.bucket, "") from None
        self._bucket_checked = True

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head(key)
        if response is None:
            return None
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            mtime=response["LastModified"].timestamp(),
            etag=response.get("ETag"),
            version_id=_version(response.get("VersionId")),
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
        for item in _list_pages(self._client(), self.bucket, self.prefix + prefix, delimited=False):
            key = item["Key"][len(self.prefix) :]
            if key < previous:  # S3 lists in UTF-8 order; some compatible stores do not
                raise StoreError(f"{self.url}: the endpoint does not list keys in order")
            previous = key
            yield ObjectInfo(key, int(item["Size"]), item["LastModified"].timestamp(), item.get("ETag"))

    def delete(self, key: str) -> None:
        with self._errors(key):
            self._client().delete_object(Bucket=self.bucket, Key=self._full(key))

    def read_ref(self, key: str) -> RefValue | None:
        with self._errors(key):
            try:
                response = self._client().get_object(Bucket=self.bucket, Key=self._full(key))
                return RefValue(body=bytes(response["Body"].read()), token=str(response["ETag"]))
            except ClientError as exc:
                if _code(exc) not in _MISSING_KEY:
                    raise
        return None

    def swap_ref(self, key: str, body: bytes, expected: str | None) -> bool:
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        with self._errors(key):
            try:
                self._client().put_object(Bucket=self.bucket, Key=self._full(key), Body=body, **condition)
            except ClientError as exc:
                if _code(exc) in _LOST_RACE or (expected is not None and _code(exc) in _MISSING_KEY):
                    return _was_retried(exc) and self._holds(key, body)
                raise
        return True

    def staging_dir(self) -> Path:
        """A private temporary folder of this process, removed when the process exits."""
        staging = self._staging
        if staging is None or staging[0] != os.getpid():
            folder = Path(tempfile.mkdtemp(prefix="prep-s3-staging-"))
            staging = self._staging = (os.getpid(), folder)
            _STAGING_DIRS.append(staging)
        return staging[1]


_STAGING_DIRS: list[tuple[int, Path]] = []


@atexit.register
def _remove_staging_dirs() -> None:
    for pid, folder in _STAGING_DIRS:
        if pid == os.getpid():  # a forked child must not remove its parent's folders
            shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class S3Object:
    """One input object found by `list_objects`; `version_id` pins reads when the bucket has one."""

    url: str
    bucket: str
    key: str
    size: int
    etag: str | None = None
    version_id: str | None = None


_INPUT_CLIENTS = _ClientCache(DEFAULT_MAX_ATTEMPTS, 2 * DEFAULT_JOBS)


def _head_object(url: str) -> S3Object | None:
    bucket, key = split_url(url)
    with _s3_errors(bucket, key):
        try:
            response = _INPUT_CLIENTS.get().head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in _MISSING_KEY:
                return None
            raise
    size, etag = int(response["ContentLength"]), response.get("ETag")
    return S3Object(url, bucket, key, size, etag, _version(response.get("VersionId")))


def list_objects(url: str) -> list[S3Object]:
    """The input objects `url` names, by key: `s3://b/key` (one object, or a folder when no
    such key exists), `s3://b/prefix/` (everything below) or `s3://b/dir/*.jsonl.zst` (a glob)."""
    bucket, key = split_url(url)
    client = _INPUT_CLIENTS.get()
    directory, _, last = key.rpartition("/")
    if any(char in last for char in "*?["):
        prefix = f"{directory}/" if directory else ""
        listed = _list_pages(client, bucket, prefix, delimited=True)
        items = [item for item in listed if fnmatchcase(item["Key"][len(prefix) :], last)]
    elif key and not key.endswith("/"):
        single = _head_object(url)
        if single is not None:
            return [single]
        items = list(_list_pages(client, bucket, f"{key}/", delimited=False))
    else:
        items = list(_list_pages(client, bucket, key, delimited=False))
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
    return _reader(_INPUT_CLIENTS.get(), obj.bucket, obj.key, obj.size, _pin(obj.version_id, obj.etag))
