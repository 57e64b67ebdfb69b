"""A real S3 endpoint for tests: moto's threaded server on 127.0.0.1, shared by the session.

Use the fixtures from any test module or conftest with
`from tests.s3support import s3_bucket, s3_endpoint, s3_request_hooks, s3_versioned_bucket  # noqa: F401`.
`s3_endpoint` puts the endpoint and dummy credentials into os.environ, so boto3 in this process
and any subprocess started by a test (e.g. the `prep` CLI) talk to the server; `s3_env()` returns
the same variables for an explicit `env=` argument. `s3_request_hooks` injects server-side
faults (`Fault`) or competing writers; `iam_enforced` makes the server check credentials.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"


@dataclass(frozen=True)
class Fault:
    """An S3 error the server answers instead of its real response; with `after_handling` the
    request still takes effect first (a response lost on the way back)."""

    status: int
    code: str = ""
    after_handling: bool = False
    truncate: int | None = None  # instead: the real response, cut off after this many body bytes


RequestHook = Callable[[dict[str, Any]], "Fault | None"]
_bucket_numbers = itertools.count()
_apps: list[_OneRequestAtATime] = []


class _OneRequestAtATime:
    """WSGI wrapper serializing moto's request handling.

    moto checks If-None-Match / If-Match and then writes without a lock, so two threads can both
    pass a condition; real S3 decides each conditional write atomically. Handling one request at
    a time gives the tests S3's semantics. Response bodies are sent outside the lock."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.hooks: list[RequestHook] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        faults = [hook(environ) for hook in list(self.hooks)]  # outside the lock: hooks may call us
        fault = next((fault for fault in faults if fault is not None), None)
        with self._lock:
            if fault is None:
                return list(self._app(environ, start_response))
            if fault.truncate is not None:
                return _truncated(self._app, environ, start_response, fault.truncate)
            if fault.after_handling:
                list(self._app(environ, lambda *args: None))
            else:
                _drain(environ)
        body = f"<Error><Code>{fault.code}</Code><Message>injected by the test</Message></Error>".encode()
        headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
        headers.append(("Connection", "close"))
        start_response(f"{fault.status} {HTTPStatus(fault.status).phrase}", headers)
        return [body]


def _truncated(app: Callable[..., Iterable[bytes]], environ: dict[str, Any],
               start_response: Callable[..., Any], keep: int) -> Iterable[bytes]:
    """The real status and headers (Content-Length included) but only `keep` body bytes."""
    captured: list[Any] = []
    body = b"".join(app(environ, lambda status, headers, *rest: captured.extend([status, headers])))
    status, headers = captured
    start_response(status, [*headers, ("Connection", "close")])
    return [body[:keep]]


def _drain(environ: dict[str, Any]) -> None:
    length = environ.get("CONTENT_LENGTH")
    environ["wsgi.input"].read(int(length)) if length else environ["wsgi.input"].read()


def s3_env(endpoint: str) -> dict[str, str]:
    """The AWS variables that point boto3 (and so prep) at `endpoint` with dummy credentials."""
    missing = os.path.join(os.path.dirname(__file__), "no-such-aws-file")
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": missing,  # keep a developer's ~/.aws out of the tests
        "AWS_SHARED_CREDENTIALS_FILE": missing,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Start moto's S3 server on a free loopback port; yields its http:// URL."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    assert server._server is not None  # the WSGI server the handler threads read `.app` from
    app = _OneRequestAtATime(server._server.app)
    server._server.app = app
    _apps.append(app)
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        for name, value in s3_env(endpoint).items():
            patch.setenv(name, value)
        yield endpoint
    server.stop()
    _apps.remove(app)


@pytest.fixture
def s3_request_hooks(s3_endpoint: str) -> Iterator[list[RequestHook]]:
    """Callables the server runs with each request's WSGI environ before handling it, to stage a
    competing writer at an exact moment or to return a Fault; emptied after the test."""
    hooks = _apps[-1].hooks
    yield hooks
    hooks.clear()


def admin_client() -> Any:
    """A boto3 S3 client on the test endpoint, for arranging and inspecting test state."""
    return _client_for(os.environ["AWS_ENDPOINT_URL"])


@functools.cache
def _client_for(endpoint: str) -> Any:
    return boto3.session.Session().client("s3", endpoint_url=endpoint)


def new_bucket(versioned: bool = False) -> str:
    """Create a fresh, uniquely named bucket; returns `s3://name`."""
    name = f"test-{next(_bucket_numbers)}-{uuid.uuid4().hex[:12]}"
    client = admin_client()
    client.create_bucket(Bucket=name)
    if versioned:
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return f"s3://{name}"


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """The s3:// URL of a fresh, empty, unversioned bucket."""
    return new_bucket()


@pytest.fixture
def s3_versioned_bucket(s3_endpoint: str) -> str:
    """The s3:// URL of a fresh, empty bucket with versioning enabled."""
    return new_bucket(versioned=True)


@contextmanager
def iam_enforced(endpoint: str) -> Iterator[None]:
    """Make the server check signatures and IAM permissions of every request inside the block."""

    def set_free_requests(count: str) -> str:
        url = f"{endpoint}/moto-api/reset-auth"
        request = urllib.request.Request(url, data=count.encode(), method="POST")
        request.add_header("Content-Type", "text/plain")  # a form type would hide the body from moto
        with urllib.request.urlopen(request) as response:
            return str(json.load(response)["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"])

    previous = set_free_requests("0")
    try:
        yield
    finally:
        set_free_requests(previous)
