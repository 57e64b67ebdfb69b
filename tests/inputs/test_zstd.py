"""Compressed inputs cut short or followed by garbage fail naming the file; multi-frame and empty files read."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import zstandard

import prep.inputs.sources as sources
from prep.errors import InputError
from prep.inputs.sources import SourceFile, discover, hash_source, open_decoded
from prep.stages.read import BadRecord, Document, plan_read_tasks, read_documents
from tests.helpers import make_records, write_pipeline
from tests.runner.buildsupport import build_local

RECORDS = make_records(30, seed=5)
LINES = [json.dumps(record).encode() + b"\n" for record in RECORDS]


def _frames(lines: list[bytes], compressor: zstandard.ZstdCompressor | None = None) -> list[bytes]:
    """Each line compressed as its own zstd frame."""
    compressor = compressor or zstandard.ZstdCompressor()
    return [compressor.compress(line) for line in lines]


def _source(path: Path) -> SourceFile:
    (source,) = discover((path.name,), path.parent, "auto")
    return hash_source(source)


def _read(path: Path) -> list[Document | BadRecord]:
    """Every item the read stage yields for the file (raises its InputError)."""
    source = _source(path)
    return [item for task in plan_read_tasks(source, "text", "id") for item in read_documents(task, {})]


def _texts(path: Path) -> list[str]:
    items = _read(path)
    assert all(isinstance(item, Document) for item in items), items
    return [item.text for item in items if isinstance(item, Document)]


def _decoded(data: bytes, tmp_path: Path, name: str = "blob.txt.zst") -> bytes:
    """The bytes open_decoded yields for a file holding `data`."""
    path = tmp_path / name
    path.write_bytes(data)
    with open_decoded(_source(path)) as stream:
        return stream.read()


def _expect_truncated(path: Path) -> None:
    with pytest.raises(InputError, match="truncated zstd stream") as caught:
        _read(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert caught.value.exit_code == 2


def test_clean_multi_frame_zstd_reads_every_document(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(_frames(LINES)))
    assert _texts(path) == [record["text"] for record in RECORDS]


def test_skippable_frames_and_frame_options_read_alike(tmp_path: Path) -> None:
    skippable = struct.pack("<II", 0x184D2A5E, 7) + b"seektab"
    frames = (_frames(LINES[:10], zstandard.ZstdCompressor(write_checksum=True)) + [skippable]
              + _frames(LINES[10:20], zstandard.ZstdCompressor(write_content_size=False))
              + _frames(LINES[20:], zstandard.ZstdCompressor(level=19)) + [skippable])
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(frames))
    assert _texts(path) == [record["text"] for record in RECORDS]


def test_zstd_cut_inside_a_later_frame_fails(tmp_path: Path) -> None:
    frames = _frames(LINES)
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(frames)[: -len(frames[-1]) // 2])
    _expect_truncated(path)


def test_zstd_cut_right_after_a_frame_header_fails(tmp_path: Path) -> None:
    frames = _frames(LINES)
    header = zstandard.frame_header_size(frames[12])
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(frames[:12]) + frames[12][:header])
    _expect_truncated(path)
    with pytest.raises(InputError, match=f"inside the frame starting at byte {len(b''.join(frames[:12]))}$"):
        _read(path)


@pytest.mark.parametrize("keep", [2, 4, 5])
def test_zstd_cut_inside_a_frame_header_fails(tmp_path: Path, keep: int) -> None:
    frames = _frames(LINES)
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(frames[:3]) + frames[3][:keep])
    _expect_truncated(path)


@pytest.mark.parametrize("keep", [6, 10])
def test_zstd_cut_inside_a_skippable_frame_fails(tmp_path: Path, keep: int) -> None:
    skippable = struct.pack("<II", 0x184D2A50, 8) + b"metadata"
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(_frames(LINES[:3])) + skippable[:keep])
    _expect_truncated(path)


def test_zstd_cut_in_a_single_frame_file_fails(tmp_path: Path) -> None:
    data = zstandard.ZstdCompressor().compress(b"".join(LINES))
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(data[: len(data) * 2 // 3])
    _expect_truncated(path)


def test_zstd_trailing_garbage_fails(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"".join(_frames(LINES)) + b"not zstd at all\n")
    with pytest.raises(InputError, match="zstd") as caught:
        _read(path)
    assert str(caught.value).startswith(f"{path}: ")


@pytest.mark.parametrize("cut", ["mid-frame", "after-header"])
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_build_fails_on_truncated_zstd_under_both_policies(tmp_path: Path, tokenizer_path: Path, on_error: str,
                                                           cut: str) -> None:
    frames = _frames(LINES)
    keep = len(frames[-1]) // 2 if cut == "mid-frame" else zstandard.frame_header_size(frames[-1])
    (tmp_path / "corpus").mkdir()
    path = tmp_path / "corpus" / "a.jsonl.zst"
    path.write_bytes(b"".join(frames[:-1]) + frames[-1][:keep])
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus/*.jsonl.zst"], extra_input=f'on_error = "{on_error}"\n')
    with pytest.raises(InputError, match="truncated zstd stream") as caught:
        build_local(pipeline, tmp_path / "store")
    assert "a.jsonl.zst" in str(caught.value) and caught.value.exit_code == 2


def test_empty_zst_and_gz_are_files_without_documents(tmp_path: Path) -> None:
    for name in ("a.jsonl.zst", "a.jsonl.gz"):
        (tmp_path / name).write_bytes(b"")
        assert _read(tmp_path / name) == []


def test_gzip_cut_mid_stream_fails(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(LINES))
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="cannot read") as caught:
        _read(path)
    assert str(caught.value).startswith(f"{path}: ")


PAYLOADS = {
    "text": b"".join(LINES) * 3,
    "random": random.Random(3).randbytes(3000),  # raw blocks
    "zeros": bytes(600_000),  # RLE blocks after the first
    "blocks": b"".join(LINES) * 400 + random.Random(4).randbytes(300_000),  # several blocks, raw and compressed
}


@pytest.mark.parametrize(("payload", "chunk"), [(payload, chunk) for payload in sorted(PAYLOADS)
                                                 for chunk in ([64, 1000, 4 << 20] if payload == "blocks" else [1, 3, 64])])
def test_zstd_prefixes_fail_unless_they_end_on_a_frame_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 payload: str, chunk: int) -> None:
    monkeypatch.setattr(sources, "READ_CHUNK", chunk)
    data = PAYLOADS[payload]
    half = len(data) // 2
    frames = [zstandard.ZstdCompressor(write_checksum=True).compress(data[:half]),
              zstandard.ZstdCompressor(write_content_size=False).compress(data[half:])]
    whole = b"".join(frames)
    assert _decoded(whole, tmp_path) == data
    assert _decoded(frames[0], tmp_path) == data[:half]
    assert _decoded(b"", tmp_path) == b""
    rng = random.Random(len(whole))
    cuts = set(range(1, 40)) | {len(frames[0]) + n for n in range(1, 40)} | {len(whole) - n for n in range(1, 20)}
    cuts |= set(rng.sample(range(1, len(whole)), min(40, len(whole) - 1)))
    for cut in sorted(cut for cut in cuts if 0 < cut < len(whole) and cut != len(frames[0])):
        with pytest.raises(InputError, match="truncated zstd stream"):
            _decoded(whole[:cut], tmp_path)


def test_zstd_cli_output_reads_back(tmp_path: Path) -> None:
    zstd_cli = shutil.which("zstd")
    if zstd_cli is None:
        pytest.skip("no zstd command")
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b"".join(LINES) * 50)
    subprocess.run([zstd_cli, "-q", "-19", "--long=27", "--check", plain, "-o", tmp_path / "a.jsonl.zst"], check=True)
    assert _decoded((tmp_path / "a.jsonl.zst").read_bytes(), tmp_path) == plain.read_bytes()
