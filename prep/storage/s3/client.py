"""The S3 backend's foundations: settings constants, URL and size parsing, one boto3 client per
process, translation of botocore failures into one-line PrepErrors, and the retries botocore
does not do itself. The `prep.storage.s3` package is the only code of prep that imports boto3."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    FlexibleChecksumError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from urllib3.exceptions import SSLError as BodySSLError  # a TLS record failing its MAC mid-body: botocore passes it on

from prep.errors import NotFoundError, PrepError, StoreError

MIB = 1 << 20
MIN_PART_SIZE = 5 * MIB  # S3's minimum for every part but the last
DEFAULT_MULTIPART_THRESHOLD = 64 * MIB
DEFAULT_PART_SIZE = 16 * MIB
DEFAULT_JOBS = 8
DEFAULT_MAX_ATTEMPTS = 8
THRESHOLD_ENV = "PREP_S3_MULTIPART_THRESHOLD"
TIMEOUT_ENVS = {"connect_timeout": ("PREP_S3_CONNECT_TIMEOUT", 10.0), "read_timeout": ("PREP_S3_READ_TIMEOUT", 60.0)}
"""Seconds to wait for a connection, and for each read of an answer, per attempt (botocore's own
default is 60 s for both: eight attempts at an endpoint that accepts and never answers took 8 minutes)."""
MAX_PARTS = 10_000  # S3's limits: parts per upload, bytes per single PUT or part
MAX_PUT_SIZE = 5 << 30

LOST_RACE = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
PRECONDITION_FAILED = {"PreconditionFailed", "412"}
MISSING_KEY = {"NoSuchKey", "404", "NotFound"}
_BAD_CREDENTIALS = {
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "TokenRefreshRequired", "InvalidClientTokenId", "AuthorizationHeaderMalformed",
}
_DENIED = {"AccessDenied", "AllAccessDisabled"}
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError)
_BROKEN_OFF = (ResponseStreamingError, IncompleteReadError, ConnectionClosedError, BodySSLError)
_STREAM_ERRORS = (*_BROKEN_OFF, ReadTimeoutError, FlexibleChecksumError)  # broke off, stalled, or arrived damaged
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


def timeouts() -> dict[str, float]:
    """The client's connect and read timeouts, from TIMEOUT_ENVS (StoreError naming a bad value)."""
    found = {}
    for option, (name, default) in TIMEOUT_ENVS.items():
        text = os.environ.get(name, "").strip()
        try:
            seconds = float(text) if text else default
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise StoreError(f"S3 configuration: {name}={text!r} is not a positive number of seconds")
        found[option] = seconds
    return found


def part_size_for(size: int, preferred: int) -> int:
    """The part size for a `size`-byte upload: `preferred`, raised to whole MiB when needed to
    stay within MAX_PARTS parts."""
    needed = -(-size // MAX_PARTS)
    return max(preferred, -(-needed // MIB) * MIB)


def error_code(exc: ClientError) -> str:
    """The S3 error code of a failed request (`NoSuchKey`, `412`, ...)."""
    return str(exc.response.get("Error", {}).get("Code", ""))


def one_line(text: str) -> str:
    return " ".join(text.split())


def translate(exc: Exception, bucket: str, key: str) -> PrepError:
    """One-line PrepError for a botocore failure on `s3://bucket/key`."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    if isinstance(exc, ClientError):
        code = error_code(exc)
        if code == "NoSuchBucket":
            return StoreError(f"s3://{bucket}: bucket does not exist")
        if code in MISSING_KEY:
            return NotFoundError(f"{where}: no such key")
        if code in PRECONDITION_FAILED:  # only reads get here: writes handle their own
            return StoreError(f"{where}: object changed while being read")
        if code in _BAD_CREDENTIALS:
            return StoreError(f"{where}: credentials rejected by the S3 endpoint ({code})")
        if code == "403":  # a HEAD's error has no body to tell the two apart
            return StoreError(f"{where}: access denied or credentials rejected (HTTP 403; S3 also answers "
                              "403 for a missing key when the credentials lack s3:ListBucket, which prep needs)")
        if code in _DENIED:
            return StoreError(f"{where}: access denied")
        message = exc.response.get("Error", {}).get("Message", "")
        return StoreError(f"{where}: S3 {exc.operation_name} failed: {code} {one_line(message)}")
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StoreError(f"{where}: no usable AWS credentials (set AWS_ACCESS_KEY_ID or AWS_PROFILE)")
    if isinstance(exc, FlexibleChecksumError):
        return StoreError(f"{where}: bytes arrived damaged ({one_line(str(exc))})")
    if isinstance(exc, _UNREACHABLE):
        return StoreError(f"{where}: cannot reach the S3 endpoint ({one_line(str(exc))})")
    if isinstance(exc, _BROKEN_OFF):  # each botocore release words (and classes) these differently
        return StoreError(f"{where}: the connection kept dropping before the whole answer arrived ({one_line(str(exc))})")
    return StoreError(f"{where}: {one_line(str(exc))}")


@contextmanager
def s3_errors(bucket: str, key: str) -> Iterator[None]:
    """Turn botocore failures inside the block into the PrepError `translate` picks."""
    try:
        yield
    except (ClientError, BotoCoreError, BodySSLError) as exc:
        raise translate(exc, bucket, key) from None


def retry(call: Callable[[], T], retryable: Callable[[Exception], bool], attempts: int) -> T:
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


def was_retried(exc: ClientError) -> bool:
    """True when botocore re-sent the request, so an earlier attempt may have taken effect."""
    return bool(exc.response.get("ResponseMetadata", {}).get("RetryAttempts"))


def is_conflict(exc: Exception) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) in {"ConditionalRequestConflict", "409"}


def is_stream_error(exc: Exception) -> bool:
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
class ClientCache:
    """One boto3 client per process: clients are thread-safe but must not cross a fork."""

    max_attempts: int
    pool_size: int
    _entry: tuple[int, Any] | None = field(default=None, repr=False)

    def get(self) -> Any:
        """This process's client, created on first use from the current AWS environment."""
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
        config = Config(retries=retries, max_pool_connections=self.pool_size, **timeouts())
        try:  # a fresh session reads the AWS environment now, not when boto3 was first used
            core = botocore.session.get_session()
            core.register_component("data_loader", _shared_loader())  # parsed API models are reused
            return boto3.session.Session(botocore_session=core).client("s3", config=config)
        except (BotoCoreError, ValueError) as exc:  # botocore raises ValueError for a malformed endpoint URL
            raise StoreError(f"S3 configuration: {one_line(str(exc))}") from None
