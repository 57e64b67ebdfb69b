"""Writing S3 objects: single conditional PUTs and parallel multipart uploads whose completion
carries the condition, so a key is created at once, whole, and only if it is still free."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

from botocore.exceptions import BotoCoreError, ClientError

from prep.errors import StoreError
from prep.faults import crash_point
from prep.storage.parallel import in_sequence
from prep.storage.s3.client import (
    LOST_RACE,
    MISSING_KEY,
    PRECONDITION_FAILED,
    error_code,
    is_conflict,
    retry,
    s3_errors,
    was_retried,
)

CREATE_ONLY = {"IfNoneMatch": "*"}


class CompletionConflict(StoreError):
    """A conditional CompleteMultipartUpload answered 409: the key may still be free, and the
    upload (aborted) has to be started over."""


def is_completion_conflict(exc: Exception) -> bool:
    """Whether `exc` asks for a multipart upload to be done again."""
    return isinstance(exc, CompletionConflict)


@dataclass(frozen=True)
class Upload:
    """Where and how one object is written: `condition` holds the conditional-write headers."""

    client: Any
    bucket: str
    key: str
    metadata: dict[str, str]
    condition: dict[str, str]

    def errors(self) -> AbstractContextManager[None]:
        """Botocore failures inside the block become one-line PrepErrors naming this key."""
        return s3_errors(self.bucket, self.key)


def holds(client: Any, bucket: str, key: str, data: bytes) -> bool:
    """Whether `key` holds exactly `data`, judged by its ETag (the MD5 of a single-PUT object
    unless KMS encryption is on); settles a condition that failed only on a retried request."""
    return _has_etag(client, bucket, key, f'"{hashlib.md5(data).hexdigest()}"')


def _has_etag(client: Any, bucket: str, key: str, etag: str) -> bool:
    with s3_errors(bucket, key):
        try:
            response = client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) in MISSING_KEY:
                return False
            raise
    return bool(response.get("ETag") == etag)


def multipart_etag(parts: list[dict[str, Any]]) -> str | None:
    """The ETag S3 gives the completed upload of `parts`: the MD5 of their MD5s, a dash and their
    count; None when a part's ETag is no MD5 (KMS encryption), so no completion can be told ours."""
    try:
        digests = b"".join(bytes.fromhex(str(part["ETag"]).strip('"')) for part in parts)
    except ValueError:
        return None
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"' if len(digests) == 16 * len(parts) else None


def _completed_by_retry(upload: Upload, exc: ClientError, parts: list[dict[str, Any]]) -> bool:
    """Whether a completion that failed on a re-sent request (412: the key exists; NoSuchUpload:
    the upload is gone) had in fact completed on an earlier attempt, leaving the key with our parts."""
    etag = multipart_etag(parts)
    return was_retried(exc) and etag is not None and _has_etag(upload.client, upload.bucket, upload.key, etag)


def put_single(upload: Upload, data: bytes, attempts: int) -> bool:
    """One PUT, retrying 409 conflicts; False when its condition failed (the key exists)."""

    def put() -> None:
        upload.client.put_object(Bucket=upload.bucket, Key=upload.key, Body=data, Metadata=upload.metadata,
                                 **upload.condition)

    with upload.errors():
        try:
            retry(put, is_conflict, attempts)
        except ClientError as exc:
            return _settle_lost(upload, exc, data, PRECONDITION_FAILED)
    return True


def put_ref(upload: Upload, body: bytes) -> bool:
    """One compare-and-swap PUT of a ref; False when the ref moved in between (412, or 409 when
    another conditional write to it was in flight, or a 404 when it was expected to exist)."""
    with upload.errors():
        try:
            upload.client.put_object(Bucket=upload.bucket, Key=upload.key, Body=body, **upload.condition)
        except ClientError as exc:
            codes = LOST_RACE | MISSING_KEY if "IfMatch" in upload.condition else LOST_RACE
            return _settle_lost(upload, exc, body, codes)
    return True


def _settle_lost(upload: Upload, exc: ClientError, data: bytes, lost_codes: set[str]) -> bool:
    """Re-raise `exc` unless it is a lost condition; a lost condition counts as won only when
    botocore retried and the key holds exactly `data` (the earlier attempt took effect)."""
    if error_code(exc) not in lost_codes:
        raise exc
    return was_retried(exc) and holds(upload.client, upload.bucket, upload.key, data)


def put_multipart(upload: Upload, source: BinaryIO, part_size: int, jobs: int,
                  check: Callable[[str], None]) -> bool:
    """Upload `source` in parts from threads, call `check` with the SHA-256 hex of all its bytes,
    then complete under the upload's condition; False when the condition failed (412), and
    CompletionConflict on a 409. Any failure (or a failed check) aborts the upload so no parts
    are left behind."""
    client = upload.client
    with upload.errors():
        created = client.create_multipart_upload(Bucket=upload.bucket, Key=upload.key, Metadata=upload.metadata)
    upload_id = str(created["UploadId"])
    try:
        parts, sha256 = _upload_parts(upload, upload_id, source, part_size, jobs)
        check(sha256)
        with upload.errors():
            try:
                client.complete_multipart_upload(
                    Bucket=upload.bucket, Key=upload.key, UploadId=upload_id,
                    MultipartUpload={"Parts": parts}, **upload.condition,
                )
            except ClientError as exc:
                if error_code(exc) in PRECONDITION_FAILED | {"NoSuchUpload"} and _completed_by_retry(upload, exc, parts):
                    return True
                if error_code(exc) in PRECONDITION_FAILED:
                    _abort(upload, upload_id)
                    return False
                if is_conflict(exc):  # nothing was written: S3 wants the whole upload done again
                    raise CompletionConflict(f"s3://{upload.bucket}/{upload.key}: conflicting conditional "
                                             "writes kept a multipart upload from completing") from None
                raise
    except BaseException:
        _abort(upload, upload_id)
        raise
    return True


def _upload_parts(upload: Upload, upload_id: str, source: BinaryIO, part_size: int,
                  jobs: int) -> tuple[list[dict[str, Any]], str]:
    """Read parts in order (hashing them), upload up to `jobs` at once; parts list and sha256."""
    hasher = hashlib.sha256()

    def send(number: int, chunk: bytes) -> dict[str, Any]:
        with upload.errors():
            response = upload.client.upload_part(
                Bucket=upload.bucket, Key=upload.key, UploadId=upload_id, PartNumber=number, Body=chunk
            )
        crash_point("s3.mid_multipart")  # tests kill the build here: parts uploaded, none completed
        return {"ETag": response["ETag"], "PartNumber": number}

    def tasks() -> Iterator[Callable[[], dict[str, Any]]]:
        number = 0
        while chunk := source.read(part_size):
            hasher.update(chunk)
            number += 1
            yield partial(send, number, chunk)

    parts = list(in_sequence(tasks(), jobs, "prep-s3"))
    return parts, hasher.hexdigest()


def _abort(upload: Upload, upload_id: str) -> None:
    try:
        upload.client.abort_multipart_upload(Bucket=upload.bucket, Key=upload.key, UploadId=upload_id)
    except (ClientError, BotoCoreError):
        pass  # an orphaned upload only costs storage; a bucket lifecycle rule can reap it
