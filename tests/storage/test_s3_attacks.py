"""S3Store against a hostile endpoint: broken bodies, ignored ranges, conflicting completions,
tampered objects, S3's size limits. Each failure is one line, and no wrong byte is used."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError, IncompleteReadError, ResponseStreamingError
from urllib3.exceptions import SSLError as BodySSLError

import prep.storage.s3.client as s3_client
import prep.storage.s3.s3store as s3_store
from prep.errors import IntegrityError, PrepError, StoreError
from prep.storage.s3 import MIB, MIN_PART_SIZE, S3Settings, S3Store
from tests import s3support
from tests.s3support import Fault, RequestHook, admin_client
from tests.storage.test_s3 import MULTIPART, content_key, on_request, random_bytes, split, uploads_in_progress

KEPT_DROPPING = r"the connection kept dropping before the whole answer arrived \("


def one_line_failure(error: type[PrepError], match: str, call: Any) -> None:
    """Assert `call()` raises `error` whose one-line message contains `match`."""
    with pytest.raises(error, match=match) as caught:
        call()
    assert "\n" not in str(caught.value) and caught.value.exit_code in (2, 3)


@contextmanager
def damaged_in_transit(key: str, times: int) -> Iterator[list[int]]:
    """Flip the first body byte of the first `times` GETs of `key` on the way out of the server
    (length and headers intact); yields the list of damaged GETs."""
    app = s3support._apps[-1]
    real = app._app
    damaged: list[int] = []

    def flipping(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = b"".join(real(environ, start_response))
        if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"].endswith(f"/{key}") and body:
            if len(damaged) < times:
                damaged.append(1)
                body = bytes([body[0] ^ 1]) + body[1:]
        return [body]

    app._app = flipping
    try:
        yield damaged
    finally:
        app._app = real


def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make prep's own retries immediate."""
    monkeypatch.setattr(s3_client, "time", SimpleNamespace(sleep=lambda seconds: None))


def test_a_malformed_endpoint_url_is_one_line(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not a url")
    one_line_failure(StoreError, "^S3 configuration: Invalid endpoint: not a url$", lambda: S3Store(s3_bucket).head("k"))


def test_a_body_that_keeps_breaking_off_is_one_line(
    s3_bucket: str, s3_request_hooks: list[RequestHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    no_backoff(monkeypatch)
    store = S3Store(s3_bucket, S3Settings(max_attempts=2))
    store.put_bytes("data/x", random_bytes(50_000))
    hook, hits = on_request("GET", "data/x", fault=Fault(200, truncate=0), times=1000)
    s3_request_hooks.append(hook)
    one_line_failure(StoreError, f"^s3://.*/data/x: {KEPT_DROPPING}", lambda: store.get_range("data/x", 0, 40_000))
    one_line_failure(StoreError, f"^s3://.*/data/x: {KEPT_DROPPING}", lambda: store.get_bytes("data/x"))
    assert len(hits) == 4  # regression: each read tried max_attempts times, not always 8


@pytest.mark.parametrize("broken", [
    IncompleteReadError(actual_bytes=0, expected_bytes=40_000),
    ResponseStreamingError(error="('Connection broken: IncompleteRead(0 bytes read, 40000 more expected)')"),
    ConnectionClosedError(endpoint_url="http://127.0.0.1:1/b/data/x"),
    BodySSLError("[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC] decryption failed or bad record mac"),
], ids=lambda exc: type(exc).__name__)
def test_a_body_that_broke_off_is_told_in_prep_words_whatever_botocore_raised(broken: Exception) -> None:
    """Regression: the message was botocore's own wording, which changes between releases (1.44
    says `0 read, but total bytes expected is 40000.` where 1.43 named IncompleteRead)."""
    error = s3_client.translate(broken, "b", "data/x")
    assert isinstance(error, StoreError) and error.exit_code == 2
    assert str(error) == f"s3://b/data/x: the connection kept dropping before the whole answer arrived ({broken})"


def test_the_cli_says_the_connection_kept_dropping_in_one_line(s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    """What a user sees (a subprocess reaches the same server, faults and all): exit 2, one line."""
    S3Store(s3_bucket).swap_ref("refs/ds/latest.json", b'{"snapshot": 1}', None)
    hook, hits = on_request("GET", "refs/ds/latest.json", fault=Fault(200, truncate=0), times=1000)
    s3_request_hooks.append(hook)
    result = subprocess.run([sys.executable, "-m", "prep.cli.main", "show", "ds@latest", "--store", s3_bucket],
                            check=False, capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert result.returncode == 2 and result.stdout == "", result
    assert re.fullmatch(rf"prep: error: {re.escape(s3_bucket)}/refs/ds/latest.json: {KEPT_DROPPING}[^\n]*\)\n", result.stderr)
    assert len(hits) == 8


def test_a_ref_read_that_breaks_off_is_tried_again(s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    store = S3Store(s3_bucket)
    body = random_bytes(5000)
    assert store.swap_ref("refs/ds/r.json", body, None)
    hook, hits = on_request("GET", "refs/ds/r.json", fault=Fault(200, truncate=10))
    s3_request_hooks.append(hook)
    value = store.read_ref("refs/ds/r.json")
    assert value is not None and value.body == body and len(hits) == 2


def test_bytes_damaged_in_transit_fail_the_read(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    no_backoff(monkeypatch)
    store = S3Store(s3_bucket)
    data = random_bytes(3 * MIB)  # longer than the stream's buffer: the damage is handed out first
    store.put_bytes("tasks/t.json", data)
    store.swap_ref("refs/ds/r.json", b'{"snapshot": 1}', None)
    damaged = "bytes arrived damaged"
    with damaged_in_transit("tasks/t.json", times=1000):
        one_line_failure(StoreError, damaged, lambda: store.get_bytes("tasks/t.json"))
        with store.open("tasks/t.json") as stream:
            one_line_failure(StoreError, damaged, lambda: [stream.read(MIB) for _ in range(3)])
    with damaged_in_transit("refs/ds/r.json", times=1) as hits:
        value = store.read_ref("refs/ds/r.json")  # a damaged ref read is tried again
        assert value is not None and value.body == b'{"snapshot": 1}' and hits == [1]
    with damaged_in_transit("refs/ds/r.json", times=1000):
        one_line_failure(StoreError, damaged, lambda: store.read_ref("refs/ds/r.json"))
    assert store.get_bytes("tasks/t.json") == data


def test_an_endpoint_that_ignores_range_is_refused(s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    store = S3Store(s3_bucket)
    data = random_bytes(2 * MIB)
    store.put_bytes("data/r", data)
    assert store.get_range("data/r", 100, 10) == data[100:110]

    def drop_range(environ: dict[str, Any]) -> None:
        environ.pop("HTTP_RANGE", None)  # a proxy or endpoint that answers 200 with the whole object

    s3_request_hooks.append(drop_range)
    ignored = "ignored the Range of a GET from byte 100 "
    one_line_failure(StoreError, ignored, lambda: store.get_range("data/r", 100, 10))
    with store.open("data/r") as stream:
        stream.seek(100)
        one_line_failure(StoreError, ignored, lambda: stream.read(10))
    one_line_failure(StoreError, "negative read offset -3", lambda: store.get_range("data/r", -3, 2))


def test_a_conflicting_completion_starts_the_upload_over(
    s3_bucket: str, s3_request_hooks: list[RequestHook]
) -> None:
    bucket, _ = split(s3_bucket)
    store = S3Store(s3_bucket, MULTIPART)
    data = random_bytes(MIN_PART_SIZE + 10)
    conflict = Fault(409, "ConditionalRequestConflict")  # S3: nothing written, upload again
    hook, hits = on_request("POST", "data/big", "uploadId=", fault=conflict)
    s3_request_hooks.append(hook)
    assert store.put_bytes("data/big", data) is True
    assert len(hits) == 2 and store.get_bytes("data/big") == data
    assert uploads_in_progress(bucket) == []

    stubborn = S3Store(s3_bucket, S3Settings(MIB, MIN_PART_SIZE, jobs=2, max_attempts=2))
    always, _ = on_request("POST", "data/never", "uploadId=", fault=conflict, times=1000)
    s3_request_hooks.append(always)
    one_line_failure(StoreError, "conflicting conditional writes", lambda: stubborn.put_bytes("data/never", data))
    assert stubborn.head("data/never") is None and uploads_in_progress(bucket) == []


@pytest.mark.parametrize("tamper", ["flipped", "truncated"])
def test_a_downloaded_content_object_must_hash_to_its_name(s3_bucket: str, tmp_path: Path, tamper: str) -> None:
    bucket, _ = split(s3_bucket)
    store = S3Store(s3_bucket, MULTIPART)
    data = random_bytes(MIN_PART_SIZE + 77)
    key = content_key(data)
    store.put_bytes(key, data)
    bad = bytes([data[0] ^ 1]) + data[1:] if tamper == "flipped" else data[:-1]
    admin_client().put_object(Bucket=bucket, Key=key, Body=bad)  # changed behind prep's back
    dest = tmp_path / "out" / "object"
    one_line_failure(IntegrityError, "not to the key's name", lambda: store.download_file(key, dest, jobs=2))
    assert list(dest.parent.iterdir()) == []  # neither the object nor a temporary
    other = tmp_path / "plain"
    admin_client().put_object(Bucket=bucket, Key="data/plain", Body=bad)
    assert store.download_file("data/plain", other, jobs=2) == hashlib.sha256(bad).hexdigest()


def test_parts_grow_to_stay_within_the_part_limit(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_client, "MAX_PARTS", 2)
    store = S3Store(s3_bucket, MULTIPART)
    data = random_bytes(3 * MIN_PART_SIZE + 1)  # four parts of the configured size
    assert store.put_bytes("data/many", data) is True
    bucket, _ = split(s3_bucket)
    assert admin_client().head_object(Bucket=bucket, Key="data/many")["ETag"].endswith('-2"')
    assert store.get_bytes("data/many") == data


def test_objects_beyond_a_single_put_go_up_in_parts(
    s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = S3Store(s3_bucket, S3Settings(multipart_threshold=1 << 40, part_size=MIN_PART_SIZE))
    monkeypatch.setattr(s3_store, "MAX_PUT_SIZE", MIB)  # S3 refuses a single PUT above it
    path = tmp_path / "big"
    path.write_bytes(random_bytes(MIB + 1))
    assert store.put_file("data/big", path) is True
    bucket, _ = split(s3_bucket)
    assert admin_client().head_object(Bucket=bucket, Key="data/big")["ETag"].endswith('-1"')


def _completions(*faults: Fault | None, action: Callable[[], None] | None = None) -> RequestHook:
    """A hook answering the n-th CompleteMultipartUpload of `data/big` with `faults[n]` (None: moto's own)."""
    seen: list[int] = []

    def hook(environ: dict[str, Any]) -> Fault | None:
        if environ["REQUEST_METHOD"] != "POST" or not environ["PATH_INFO"].endswith("/data/big"):
            return None
        if "uploadId=" not in environ.get("QUERY_STRING", ""):
            return None
        seen.append(1)
        if len(seen) == 1 and action is not None:
            action()
        return faults[len(seen) - 1] if len(seen) <= len(faults) else None

    return hook


@pytest.mark.parametrize("retry_answer", [Fault(412, "PreconditionFailed"), None])
def test_a_completion_whose_answer_was_lost_counts_as_won(
    s3_bucket: str, s3_request_hooks: list[RequestHook], retry_answer: Fault | None
) -> None:
    """Regression: the completion took effect, its answer was lost (a 500), and botocore's retry met
    its effect (412, or moto's NoSuchUpload): the put reported the key as someone else's."""
    store = S3Store(s3_bucket, MULTIPART)
    data = random_bytes(MIN_PART_SIZE + 10)
    s3_request_hooks.append(_completions(Fault(500, "InternalError", after_handling=True), retry_answer))
    assert store.put_bytes("data/big", data) is True
    assert store.get_bytes("data/big") == data


def test_a_retried_completion_meeting_another_writers_object_is_lost(
    s3_bucket: str, s3_request_hooks: list[RequestHook]
) -> None:
    bucket, prefix = split(s3_bucket)
    store = S3Store(s3_bucket, MULTIPART)
    rival = random_bytes(MIN_PART_SIZE + 10, seed=1)

    def rival_writes() -> None:
        admin_client().put_object(Bucket=bucket, Key=f"{prefix}/data/big".lstrip("/"), Body=rival)

    s3_request_hooks.append(_completions(Fault(500, "InternalError"), action=rival_writes))
    assert store.put_bytes("data/big", random_bytes(MIN_PART_SIZE + 10)) is False
    assert store.get_bytes("data/big") == rival and uploads_in_progress(bucket) == []
