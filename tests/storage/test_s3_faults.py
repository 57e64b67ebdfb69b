"""S3 reads against answers that look right but are not: ranges wider or narrower than asked,
bodies cut short without a length to tell, answers missing the headers S3 always sends."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from prep import hashing
from prep.errors import StoreError
from prep.storage.s3 import S3Settings, S3Store, hash_object, list_objects
from prep.store.cas import object_key
from prep.transfer import fetch as fetch_module
from prep.transfer.fetch import download_verified
from tests import s3support
from tests.s3support import RequestHook
from tests.storage.test_s3 import random_bytes
from tests.storage.test_s3_attacks import no_backoff, one_line_failure

Answer = tuple[str, list[tuple[str, str]], bytes]


@contextmanager
def rewritten(which: Callable[[dict[str, Any]], bool], edit: Callable[[Answer], Answer | None],
              times: int) -> Iterator[list[int]]:
    """Pass the first `times` answers to requests `which` accepts that `edit` changes (None: left
    alone) through it on the way out of the server."""
    app = s3support._apps[-1]
    real = app._app
    edited: list[int] = []

    def editing(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        captured: list[Any] = []
        body = b"".join(real(environ, lambda status, headers, *rest: captured.extend([status, headers])))
        answer: Answer = (captured[0], list(captured[1]), body)
        if which(environ) and len(edited) < times:
            changed = edit(answer)
            if changed is not None:
                edited.append(1)
                answer = changed
        start_response(answer[0], answer[1])
        return [answer[2]]

    app._app = editing
    try:
        yield edited
    finally:
        app._app = real


def request(method: str, key: str = "", query: str = "") -> Callable[[dict[str, Any]], bool]:
    """Accepts `method` requests (of a path ending in `/key`, if given) whose query holds `query`."""
    return lambda environ: (environ["REQUEST_METHOD"] == method and query in environ.get("QUERY_STRING", "")
                            and (not key or environ["PATH_INFO"].endswith(f"/{key}")))


def unsized_and_cut(keep: int, statuses: tuple[str, ...] = ("200", "206")) -> Callable[[Answer], Answer | None]:
    """An answer (of one of `statuses`) whose body stops after `keep` bytes and that has no
    Content-Length to show it."""

    def edit(answer: Answer) -> Answer | None:
        status, headers, body = answer
        if not status.startswith(statuses):
            return None
        return status, [(name, value) for name, value in headers if name.lower() != "content-length"], body[:keep]

    return edit


def set_range(key: str, rewrite: Callable[[str], str]) -> RequestHook:
    """A hook changing the Range header of GETs of `key` before the server sees it."""

    def hook(environ: dict[str, Any]) -> None:
        if environ["PATH_INFO"].endswith(f"/{key}") and "HTTP_RANGE" in environ:
            environ["HTTP_RANGE"] = rewrite(environ["HTTP_RANGE"])

    return hook


def wider(asked: str) -> str:
    """`bytes=A-B` becomes `bytes=A-`: the rest of the object."""
    return asked.partition("-")[0] + "-"


def narrower(asked: str) -> str:
    """`bytes=A-B` becomes `bytes=A-(A+4)`: five bytes."""
    first = int(asked.removeprefix("bytes=").partition("-")[0])
    return f"bytes={first}-{first + 4}"


def fetch(store: S3Store, data: bytes, dest: Path) -> None:
    """Copy the content object of `data` to `dest` as `prep pull` and the reader's cache do."""
    digest = hashing.Digest(hashlib.sha256(data).hexdigest(), len(data))
    download_verified(store, digest, dest, temp=dest.with_name("temp"), what="a shard",
                      on_bytes=lambda count: None, stop=threading.Event())


@pytest.mark.parametrize("answered", ["wider", "narrower"])
def test_a_range_answered_with_other_bytes_is_refused(
    s3_bucket: str, s3_request_hooks: list[RequestHook], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    answered: str,
) -> None:
    """Regression: a 206 starting at the right byte but ending elsewhere was taken as the range:
    wider, the whole rest of the object was read into memory (per range of a pull); narrower, the
    bytes after it were silently missing, and a pull blamed the store's object (IntegrityError)."""
    monkeypatch.setattr(fetch_module, "RANGE_SIZE", 16 << 10)  # a pull of several ranges
    store = S3Store(s3_bucket)
    data = random_bytes(100_000)
    key = object_key(hashlib.sha256(data).hexdigest())
    store.put_bytes(key, data)
    s3_request_hooks.append(set_range(key, wider if answered == "wider" else narrower))
    refused = "^s3://.*: the S3 endpoint answered a GET of bytes 10-19 with bytes 10-"
    one_line_failure(StoreError, refused, lambda: store.get_range(key, 10, 10))
    one_line_failure(StoreError, "answered a GET of bytes 0-", lambda: fetch(store, data, tmp_path / "shard"))
    assert not (tmp_path / "shard").exists()


def test_a_range_cut_short_without_a_length_is_retried(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a ranged body that ended early with no Content-Length to tell was returned short."""
    no_backoff(monkeypatch)
    store = S3Store(s3_bucket, S3Settings(max_attempts=3))
    data = random_bytes(50_000)
    store.put_bytes("data/x", data)
    with rewritten(request("GET", "data/x"), unsized_and_cut(1000), times=1) as edited:
        assert store.get_range("data/x", 100, 20_000) == data[100:20_100]
    assert edited == [1]
    with rewritten(request("GET", "data/x"), unsized_and_cut(1000), times=1000):
        one_line_failure(StoreError, "^s3://.*/data/x: .*1000 .*20000", lambda: store.get_range("data/x", 100, 20_000))


def test_a_stream_cut_short_without_a_length_reads_on(s3_bucket: str) -> None:
    """Regression: a reopened stream's body that ended early with no Content-Length failed the
    read ("object ended early") instead of being reopened from where it stopped."""
    store = S3Store(s3_bucket)
    data = random_bytes(50_000)
    store.put_bytes("data/x", data)
    with rewritten(request("GET", "data/x"), unsized_and_cut(1000, ("206",)), times=3) as edited, store.open("data/x") as stream:
        stream.seek(100)
        assert stream.read() == data[100:]
    assert edited == [1, 1, 1]


def test_a_whole_object_without_a_length_is_one_line(s3_bucket: str) -> None:
    """Regression: a GET answered without a Content-Length (chunked) was a KeyError traceback."""
    store = S3Store(s3_bucket)
    store.put_bytes("data/x", random_bytes(5000))
    obj = list_objects(f"{store.url}/data/x")[0]
    with rewritten(request("GET", "data/x"), unsized_and_cut(5000), times=1000):
        no_length = "^s3://.*/data/x: the S3 endpoint's answer has no ContentLength$"
        one_line_failure(StoreError, no_length, lambda: store.get_bytes("data/x"))
        one_line_failure(StoreError, no_length, lambda: hash_object(obj))



def without(header: str) -> Callable[[Answer], Answer]:
    """The answer less one header."""
    return lambda answer: (answer[0], [item for item in answer[1] if item[0].lower() != header], answer[2])


def test_a_ref_read_without_a_length_is_refused(s3_bucket: str) -> None:
    """Regression: a ref whose GET came without Content-Length (or checksum) and stopped early
    was returned cut short, as if it were the ref's whole body."""
    store = S3Store(s3_bucket)
    assert store.swap_ref("refs/ds/r.json", b'{"snapshot": "' + b"x" * 5000 + b'"}', None)

    def cut_unchecked(answer: Answer) -> Answer | None:
        cut = unsized_and_cut(100)(answer)
        return cut and (cut[0], [item for item in cut[1] if not item[0].lower().startswith("x-amz-checksum")], cut[2])

    with rewritten(request("GET", "refs/ds/r.json"), cut_unchecked, times=1000):
        one_line_failure(StoreError, "^s3://.*/refs/ds/r.json: the S3 endpoint's answer has no ContentLength$",
                         lambda: store.read_ref("refs/ds/r.json"))


def test_a_head_without_its_headers_is_one_line(s3_bucket: str) -> None:
    """Regression: a HEAD answered without Last-Modified or Content-Length (a proxy that drops
    them, an endpoint that is not S3) was a KeyError traceback."""
    store = S3Store(s3_bucket)
    store.put_bytes("data/x", b"x")
    for header, field in (("last-modified", "LastModified"), ("content-length", "ContentLength")):
        with rewritten(request("HEAD", "data/x"), without(header), times=1000):
            one_line_failure(StoreError, f"^s3://.*/data/x: the S3 endpoint's answer has no {field}$",
                             lambda: store.head("data/x"))
    with rewritten(request("HEAD", "data/x"), without("content-length"), times=1000):
        one_line_failure(StoreError, "answer has no ContentLength", lambda: list_objects(f"{store.url}/data/x"))
