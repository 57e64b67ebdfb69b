"""Failures an S3 user can cause come out as one-line StoreErrors (exit 2), never tracebacks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import boto3
import pytest

from prep.errors import NotFoundError, StoreError
from prep.storage.s3 import S3Settings, S3Store, list_objects
from tests.s3support import iam_enforced

OPERATIONS: dict[str, Callable[[S3Store], object]] = {
    "head": lambda store: store.head("k"),
    "get": lambda store: store.get_bytes("k"),
    "range": lambda store: store.get_range("k", 0, 10),
    "put": lambda store: store.put_bytes("k", b"x"),
    "list": lambda store: list(store.list("")),
    "read_ref": lambda store: store.read_ref("refs/r"),
    "swap_ref": lambda store: store.swap_ref("refs/r", b"x", None),
}


def failure(operation: Callable[[S3Store], object], store: S3Store) -> StoreError:
    with pytest.raises(StoreError) as caught:
        operation(store)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2
    return caught.value


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_missing_bucket(s3_endpoint: str, name: str) -> None:
    store = S3Store("s3://no-such-bucket-here/prefix")
    error = failure(OPERATIONS[name], store)
    assert type(error) is StoreError  # not a NotFoundError: the store itself is missing
    assert str(error) == "s3://no-such-bucket-here: bucket does not exist"


def test_missing_bucket_for_inputs(s3_endpoint: str) -> None:
    with pytest.raises(StoreError, match="^s3://no-such-bucket-here: bucket does not exist$"):
        list_objects("s3://no-such-bucket-here/corpus/")


def test_missing_key_is_not_found(s3_bucket: str) -> None:
    with pytest.raises(NotFoundError, match=f"^{s3_bucket}/k: no such key$"):
        S3Store(s3_bucket).get_bytes("k")


def test_unreachable_endpoint(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nobody listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    store = S3Store(s3_bucket, S3Settings(max_attempts=1))
    for operation in OPERATIONS.values():
        assert "cannot reach the S3 endpoint" in str(failure(operation, store))


def test_no_credentials(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    error = failure(OPERATIONS["get"], S3Store(s3_bucket))
    assert "no usable AWS credentials" in str(error)


def test_rejected_credentials(s3_endpoint: str, s3_bucket: str) -> None:
    store = S3Store(s3_bucket)
    with iam_enforced(s3_endpoint):
        for operation in OPERATIONS.values():
            assert "credentials rejected" in str(failure(operation, store))


def test_access_denied(s3_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    iam = boto3.session.Session().client("iam")
    iam.create_user(UserName="powerless")
    key = iam.create_access_key(UserName="powerless")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    store = S3Store(s3_bucket)
    with iam_enforced(s3_endpoint):
        for operation in OPERATIONS.values():
            assert "access denied" in str(failure(operation, store))


def test_cli_reports_a_missing_bucket_in_one_line(s3_endpoint: str) -> None:
    """The environment reaches a `prep` subprocess, and the CLI prints the store error plainly."""
    result = subprocess.run(
        [sys.executable, "-m", "prep.cli.main", "log", "ds", "--store", "s3://no-such-bucket-here"],
        check=False, capture_output=True, text=True, env=dict(os.environ), timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == "prep: error: s3://no-such-bucket-here: bucket does not exist\n"


@pytest.fixture
def silent_endpoint(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a hung proxy or server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    try:
        yield s3_bucket
    finally:
        server.close()


@pytest.mark.parametrize("name", ["get", "put", "read_ref"])
def test_an_endpoint_that_never_answers_fails_after_the_read_timeout(silent_endpoint: str, name: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: botocore's default (60 s a read) made each of eight attempts wait a minute at an
    endpoint that accepts and never answers; PREP_S3_READ_TIMEOUT sets the wait (default 60 s)."""
    monkeypatch.setenv("PREP_S3_READ_TIMEOUT", "0.3")
    started = time.monotonic()
    error = failure(OPERATIONS[name], S3Store(f"{silent_endpoint}/p", S3Settings(max_attempts=2)))
    assert "timeout" in str(error).lower() and time.monotonic() - started < 30


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan", "inf"])
@pytest.mark.parametrize("name", ["PREP_S3_READ_TIMEOUT", "PREP_S3_CONNECT_TIMEOUT"])
def test_a_bad_timeout_setting_is_one_line_naming_it(s3_bucket: str, monkeypatch: pytest.MonkeyPatch,
                                                      name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    error = failure(OPERATIONS["head"], S3Store(f"{s3_bucket}/p"))
    assert str(error) == f"S3 configuration: {name}={value!r} is not a positive number of seconds"
