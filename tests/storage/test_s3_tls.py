"""S3 reads over TLS when a body's TLS records arrive damaged: retried, then one line."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from prep.errors import StoreError
from prep.storage.s3 import S3Settings, S3Store
from tests.storage.test_s3 import random_bytes
from tests.storage.test_s3_attacks import no_backoff, one_line_failure

DATA = random_bytes(10_000)
BAD_RECORD = b"\x17\x03\x03\x00\x20" + bytes(32)  # application data no key of the session decrypts


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class DamagingServer:
    """An HTTPS endpoint serving DATA at every key; the first `damaged` GETs get their headers,
    then a TLS record that fails its MAC instead of the body."""

    def __init__(self, context: ssl.SSLContext, damaged: int) -> None:
        self.context, self.damaged, self.requests = context, damaged, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    self._answer(tls)
            except (OSError, ssl.SSLError):
                pass

    def _answer(self, tls: ssl.SSLSocket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += tls.recv(65536) or b"\r\n\r\n"
        headers = dict(line.split(": ", 1) for line in request.decode().split("\r\n")[1:] if ": " in line)
        first, _, last = headers.get("Range", headers.get("range", "bytes=0-")).removeprefix("bytes=").partition("-")
        start, stop = int(first), min(len(DATA), int(last) + 1 if last else len(DATA))
        self.requests += 1
        tls.sendall((f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{stop - 1}/{len(DATA)}\r\n"
                     f'Content-Length: {stop - start}\r\nETag: "e"\r\nConnection: close\r\n\r\n').encode())
        if self.requests <= self.damaged:
            with socket.socket(fileno=os.dup(tls.fileno())) as raw:  # beneath TLS: a record it cannot decrypt
                raw.sendall(BAD_RECORD)
            return
        tls.sendall(DATA[start:stop])

    def close(self) -> None:
        self.listener.close()


@contextmanager
def damaging_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: int) -> Iterator[DamagingServer]:
    """A DamagingServer that boto3 (and so prep) is pointed at and trusts."""
    cert, key = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = DamagingServer(context, damaged)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"https://127.0.0.1:{server.listener.getsockname()[1]}")
    try:
        yield server
    finally:
        server.close()


def test_a_body_with_a_damaged_tls_record_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str
) -> None:
    """Regression: urllib3's SSLError (a TLS record failing its MAC mid-body, as seen on real S3)
    is no botocore error: it was neither retried nor turned into one line (a traceback)."""
    no_backoff(monkeypatch)
    with damaging_endpoint(tmp_path, monkeypatch, damaged=1) as server:
        assert S3Store("s3://bucket/prefix").get_range("k", 100, 5000) == DATA[100:5100]
        assert server.requests == 2


def test_a_body_whose_tls_keeps_failing_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_endpoint: str
) -> None:
    no_backoff(monkeypatch)
    with damaging_endpoint(tmp_path, monkeypatch, damaged=1000) as server:
        store = S3Store("s3://bucket/prefix", S3Settings(max_attempts=2))
        damaged = "^s3://bucket/prefix/k: .*DECRYPTION_FAILED_OR_BAD_RECORD_MAC"
        one_line_failure(StoreError, damaged, lambda: store.get_range("k", 100, 5000))
        with store.open("k") as stream:
            one_line_failure(StoreError, damaged, stream.read)
        assert server.requests == 4  # two ranged reads, the stream's GET and one reopening
