"""Every input format reads the same documents: JSON Lines (plain, .gz, .zst, byte ranges),
Parquet (row-group ranges), text files, and a Hugging Face dataset saved to disk."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import prep.stages.read as read
from prep.inputs.sources import SourceFile, discover, hash_source
from prep.stages.read import BadRecord, Document, plan_read_tasks, read_documents
from tests.helpers import make_records, write_jsonl

RECORDS = make_records(40, seed=11)


def _hashed(sources: list[SourceFile]) -> list[SourceFile]:
    return [hash_source(source) for source in sources]


def _documents(folder: Path, pattern: str, declared: str = "auto", id_field: str | None = "id") -> list[Document]:
    sources = _hashed(discover((pattern,), folder, declared))
    found: list[Document] = []
    for source in sources:
        for task in plan_read_tasks(source, "text", id_field):
            for item in read_documents(task, {}):
                assert not isinstance(item, BadRecord), item
                found.append(item)
    return found


def _pairs(documents: list[Document]) -> list[tuple[str | None, str]]:
    return [(doc.id, doc.text) for doc in documents]


EXPECTED = [(r["id"], r["text"]) for r in RECORDS]


@pytest.fixture(params=["fast", "json"])
def json_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Read JSON Lines with the optional fast parser (when installed), then with json alone."""
    if request.param == "fast":
        pytest.importorskip("simdjson")
        assert read.fast_line_parser() is not None
    else:
        monkeypatch.setattr(read, "fast_line_parser", lambda: None)
    return str(request.param)


def test_jsonl_plain_gzip_and_zstd_read_alike(tmp_path: Path, json_parser: str) -> None:
    plain = write_jsonl(tmp_path / "plain" / "a.jsonl", RECORDS)
    data = plain.read_bytes()
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "a.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "zst").mkdir()
    (tmp_path / "zst" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    for folder in ("plain", "gz", "zst"):
        assert _pairs(_documents(tmp_path, folder)) == EXPECTED


@pytest.mark.parametrize("range_bytes", [97, 500, 1 << 20])
def test_jsonl_byte_ranges_cover_every_line_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, range_bytes: int,
                                                  json_parser: str) -> None:
    monkeypatch.setattr(read, "RANGE_BYTES", range_bytes)
    write_jsonl(tmp_path / "a.jsonl", RECORDS)
    assert _pairs(_documents(tmp_path, "a.jsonl")) == EXPECTED


def test_parquet_row_group_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read, "RANGE_BYTES", 300)
    table = pa.table({"id": [r["id"] for r in RECORDS], "text": [r["text"] for r in RECORDS]})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=7)
    (source,) = _hashed(discover(("a.parquet",), tmp_path, "auto"))
    assert len(plan_read_tasks(source, "text", "id")) > 2
    documents = _documents(tmp_path, "a.parquet")
    assert _pairs(documents) == EXPECTED
    assert [doc.row for doc in documents] == list(range(len(RECORDS)))


def test_text_files_are_one_document_each(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for index, record in enumerate(RECORDS[:5]):
        (tmp_path / "docs" / f"{index}.txt").write_text(record["text"], encoding="utf-8")
    assert [doc.text for doc in _documents(tmp_path, "docs", id_field=None)] == [r["text"] for r in RECORDS[:5]]


def test_hugging_face_dataset_saved_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    dataset = datasets.Dataset.from_dict({"id": [r["id"] for r in RECORDS], "text": [r["text"] for r in RECORDS]})
    dataset.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    sources = discover(("saved",), tmp_path, "auto")
    assert len(sources) == 3 and {s.format for s in sources} == {"hf"}
    assert sorted(_pairs(_documents(tmp_path, "saved"))) == sorted(EXPECTED)
    assert _pairs(_documents(tmp_path, "saved", declared="hf")) == _pairs(_documents(tmp_path, "saved"))


def test_bad_records_name_line_or_row(tmp_path: Path, json_parser: str) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "ok"}\n[1, 2]\n{"text": 5}\n\xff\n')
    sources = _hashed(discover(("a.jsonl",), tmp_path, "auto"))
    (task,) = plan_read_tasks(sources[0], "text", None)
    bad = [item for item in read_documents(task, {}) if isinstance(item, BadRecord)]
    messages = [item.message("a.jsonl") for item in bad]
    assert messages == ["a.jsonl:2: expected a JSON object, got list",
                        "a.jsonl:3: text field 'text' is int, not a string",
                        "a.jsonl:4: invalid UTF-8 at byte 0"]
    json.dumps(messages)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       trailing_newline=st.booleans(), cuts=st.lists(st.integers(0, 1000), max_size=6), block=st.integers(1, 64))
def test_byte_ranges_split_lines_without_overlap_or_loss(lines: list[bytes], trailing_newline: bool, cuts: list[int],
                                                         block: int) -> None:
    import io

    import prep.inputs.lines as line_reader

    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    original = line_reader.LINE_BLOCK
    line_reader.LINE_BLOCK = block
    try:
        found = [line for start, end in zip(bounds, bounds[1:])
                 for line in line_reader.iter_lines_in_range(io.BytesIO(data), start, end)]
    finally:
        line_reader.LINE_BLOCK = original
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert found == expected


