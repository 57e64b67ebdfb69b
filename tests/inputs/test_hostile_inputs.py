"""Hostile inputs found by a sweep of the input path: each failed before its fix (a wrong line
number, a traceback, a silently dropped input, a quadratic read, an id spelled "b'...'")."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prep.inputs.lines as line_reader
import prep.stages.read as read
from prep.errors import InputError
from prep.inputs.sources import SourceFile, discover, hash_source
from prep.stages.batches import read_batches
from prep.stages.read import BadRecord, plan_read_tasks, read_documents
from tests.cli.test_bad_input_sweep import _one_error_line
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline


def _source(folder: Path, name: str) -> SourceFile:
    [source] = discover((name,), folder, "auto")
    return hash_source(source)


def _bad_messages(source: SourceFile, name: str, id_field: str | None = None) -> list[str]:
    """Every bad record's message, from the per-document reader and the tokenize stage's batches."""
    found = []
    for task in plan_read_tasks(source, "text", id_field):
        found += [item.message(name) for item in read_documents(task, {}) if isinstance(item, BadRecord)]
        found += [item.message(name) for item in read_batches(task, {}, 100, 1 << 20) if isinstance(item, BadRecord)]
    return found


def test_a_bad_line_of_a_later_range_is_named_by_its_line_in_the_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A range starting inside a line skips it (the range before owns it); its first line was
    reported one too low, as the skipped line's number."""
    monkeypatch.setattr(read, "RANGE_BYTES", 50)
    lines = [b'{"text": "line %d"}' % number for number in range(1, 9)]
    lines[6] = b'{"text": 7}'
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    source = _source(tmp_path, "a.jsonl")
    assert 100 in [task.start for task in plan_read_tasks(source, "text", None)]  # byte 99 is inside line 6
    assert _bad_messages(source, "a.jsonl") == ["a.jsonl:7: text field 'text' is int, not a string"] * 2


def test_line_numbers_of_a_later_range_are_counted_once_per_task(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bad record read the whole file before its range again (skip mode, a late range of a
    large file: minutes)."""
    monkeypatch.setattr(read, "RANGE_BYTES", 2000)
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "fine fine fine"}\n' * 100 + b'{"text": 5}\n' * 50)
    source = _source(tmp_path, "a.jsonl")
    opened = []

    def counting_open(source: SourceFile) -> io.BufferedReader:
        opened.append(source.location)
        return open(source.location, "rb")

    monkeypatch.setattr(read, "open_raw", counting_open)
    task = plan_read_tasks(source, "text", None)[-1]
    bad = [item for item in read_batches(task, {}, 100, 1 << 20) if isinstance(item, BadRecord)]
    assert len(bad) == 50 and bad[-1].line == 150
    assert len(opened) == 1


class _Copied(bytes):
    """A read's bytes, counting what `pending + block` copies (bytes.__add__ defers to a subclass)."""

    total = 0

    def __radd__(self, other: bytes) -> bytes:
        _Copied.total += len(other) + len(self)
        return bytes(other) + bytes(self)


class _CountedReads(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        return _Copied(super().read(size))


def test_a_long_line_is_joined_once_not_once_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than a read was re-concatenated (and re-searched) at every read: a 400 MB
    line took 10 s of copying before a byte of it was parsed (copies counted, not timed)."""
    data = b"x" * (1 << 20) + b"\n" + b"tail"
    monkeypatch.setattr(line_reader, "LINE_BLOCK", 4096)
    monkeypatch.setattr(_Copied, "total", 0)
    blocks = list(line_reader.iter_line_blocks(_CountedReads(data), 0, sys.maxsize, 4096))
    lines = list(line_reader.iter_lines_in_range(_CountedReads(data), 0, sys.maxsize))
    assert blocks == [data[:-4], b"tail"] and lines == [data[:-5], b"tail"]
    assert _Copied.total <= 2 * len(data), "each byte of a long line is copied a bounded number of times"


def _save_state(folder: Path, state: str) -> None:
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(state)
    (folder / "data.arrow").write_bytes(b"")


def test_a_state_json_nested_too_deeply_is_an_input_error(tmp_path: Path) -> None:
    """json recursed out of the stack: a RecursionError traceback."""
    _save_state(tmp_path / "saved", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=r"saved: not a dataset saved with save_to_disk \(state\.json: maximum recursion"):
        discover(("saved",), tmp_path, "auto")


@pytest.mark.parametrize("name", ["../outside.arrow", "/etc/outside.arrow", "sub/data.arrow", ".."])
def test_a_state_json_naming_a_path_out_of_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    """datasets writes the names of files in the folder; another path read a file nobody named."""
    _save_state(tmp_path / "saved", json.dumps({"_data_files": [{"filename": name}]}))
    (tmp_path / "outside.arrow").write_bytes(b"")
    with pytest.raises(InputError, match=f"a filename is {name!r}, not a file name"):
        discover(("saved",), tmp_path, "auto")


def test_a_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    """It reached the manifest as a lone surrogate, and canonical JSON failed with a traceback."""
    folder = os.fsencode(tmp_path / "corpus")
    os.mkdir(folder)
    with open(folder + b"/caf\xe9.jsonl", "wb") as out:
        out.write(b'{"text": "hello"}\n')
    with pytest.raises(InputError, match=r"corpus/caf\\xe9\.jsonl: the file name is not valid UTF-8"):
        discover(("corpus",), tmp_path, "auto")


def test_a_file_name_that_is_not_utf8_is_one_error_line_of_the_build(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(3))
    with open(os.fsencode(tmp_path / "corpus") + b"/b\xff.jsonl", "wb") as out:
        out.write(b'{"id": "x", "text": "hello"}\n')
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    result = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1", "-q", check=False)
    assert result.returncode == 2, result.stderr
    assert _one_error_line(result.stderr).endswith(r"b\xff.jsonl: the file name is not valid UTF-8; rename it "
                                                   "(snapshots record names as UTF-8)")
    assert not (tmp_path / "store" / "refs").exists()


def test_a_dangling_symlink_a_glob_matches_is_refused_like_a_walked_one(tmp_path: Path) -> None:
    """A walked folder's dangling link failed the build; a glob's was passed over, its data missing."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(2))
    (tmp_path / "corpus" / "b.jsonl").symlink_to(tmp_path / "gone.jsonl")
    for pattern in ("corpus", "corpus/*.jsonl"):
        with pytest.raises(InputError, match=r"corpus/b\.jsonl: cannot read input file: No such file"):
            discover((pattern,), tmp_path, "auto")


def test_a_binary_id_column_is_a_bad_record_not_an_id_spelled_as_bytes(tmp_path: Path) -> None:
    """str() of a binary id gave the id "b'a'"."""
    pq.write_table(pa.table({"id": pa.array([b"a", b"b"], pa.binary()), "text": ["x", "y"]}), tmp_path / "a.parquet")
    assert _bad_messages(_source(tmp_path, "a.parquet"), "a.parquet", "id") == [
        f"a.parquet: row {row}: id field 'id' is binary, not a string or a number" for row in (0, 1)] * 2


def test_a_raw_control_character_says_so_once(tmp_path: Path) -> None:
    """json's message ends in "at": it read "Invalid control character at at column 13"."""
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "a\tb"}\n')
    assert _bad_messages(_source(tmp_path, "a.jsonl"), "a.jsonl") == [
        "a.jsonl:1: malformed JSON: Invalid control character at column 12"] * 2


def test_a_parquet_file_rewritten_with_fewer_row_groups_is_an_input_error(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A task planned from the old footer asked for a row group the new file lacks: an IndexError."""
    monkeypatch.setattr(read, "RANGE_BYTES", 2000)
    texts = [f"text {index} " * 40 for index in range(500)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet", row_group_size=100)
    last = plan_read_tasks(_source(tmp_path, "a.parquet"), "text", None)[-1]
    pq.write_table(pa.table({"text": texts[:100]}), tmp_path / "a.parquet", row_group_size=100)
    with pytest.raises(InputError, match=r"a\.parquet: changed during the build; rerun to pick up the new content"):
        list(read_batches(last, {}, 100, 1 << 20))


def test_a_file_named_like_a_glob_is_read_when_the_glob_matches_nothing(tmp_path: Path) -> None:
    """`a[1].jsonl` could not be named: its brackets made it a pattern that matched only `a1.jsonl`."""
    (tmp_path / "a[1].jsonl").write_text('{"text": "hello"}\n')
    [source] = discover(("a[1].jsonl",), tmp_path, "auto")
    assert source.rel == "a[1].jsonl"
    (tmp_path / "a1.jsonl").write_text('{"text": "other"}\n')
    assert [found.rel for found in discover(("a[1].jsonl",), tmp_path, "auto")] == ["a1.jsonl"], "a match wins"
