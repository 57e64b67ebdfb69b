"""`[input] max_document_bytes`: a record over the bound is a bad record naming its line or row
and the key, in both readers (document by document, and the tokenize stage's batches), for JSON
Lines, Parquet, Arrow and text; a build stops on it with one line, or skips it under `skip`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import prep.inputs.lines as line_reader
import prep.stages.jsonblocks as jsonblocks
from prep.inputs.sources import discover, hash_source
from prep.stages.batches import read_batches
from prep.stages.read import BadRecord, plan_read_tasks, read_documents
from prep.storage import LocalStore
from prep.store.snapshots import load_snapshot
from tests.cli.test_bad_input_sweep import _one_error_line
from tests.helpers import run_prep, write_pipeline

BOUND = 100
KEY = f"more than [input] max_document_bytes ({BOUND})"


def _bad(folder: Path, name: str) -> tuple[list[str], list[str]]:
    """The bad records' messages from the per-document reader and from the batches."""
    source = hash_source(discover((name,), folder, "auto")[0])
    by_document, by_batch = [], []
    for task in plan_read_tasks(source, "text", None, BOUND):
        by_document += [item.message(name) for item in read_documents(task, {}) if isinstance(item, BadRecord)]
        by_batch += [item.message(name) for item in read_batches(task, {}, 100, 1 << 20) if isinstance(item, BadRecord)]
    return by_document, by_batch


@pytest.mark.parametrize("read_bytes", [16, 1 << 20], ids=["spanning-reads", "within-a-read"])
def test_a_json_line_over_the_bound_is_a_bad_record_naming_its_line(tmp_path: Path, read_bytes: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_reader, "LINE_BLOCK", read_bytes)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", read_bytes)
    long = json.dumps({"text": "x" * 200})
    lines = [json.dumps({"text": "short one"}), long, json.dumps({"text": "y" * (BOUND - 12)}), long, "{}"]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:4]) + "\n" + json.dumps({"text": "last"}) + "\n")
    expected = [f"a.jsonl:2: the record is {len(long)} bytes, {KEY}", f"a.jsonl:4: the record is {len(long)} bytes, {KEY}"]
    assert _bad(tmp_path, "a.jsonl") == (expected, expected)


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_table_value_over_the_bound_is_a_bad_record_naming_its_row(tmp_path: Path, suffix: str) -> None:
    table = pa.table({"text": ["fine", "é" * 51, "also fine"]})  # 102 bytes of UTF-8 in 51 characters
    path = tmp_path / f"t{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, path)
    else:
        with ipc.new_stream(str(path), table.schema) as writer:
            writer.write_table(table)
    expected = [f"t{suffix}: row 1: the record is 102 bytes, {KEY}"]
    assert _bad(tmp_path, path.name) == (expected, expected)


def test_a_text_file_over_the_bound_is_a_bad_record_read_no_further(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("z" * (BOUND + 1))
    (tmp_path / "fits.txt").write_text("z" * BOUND)
    expected = [f"big.txt: the record is more than [input] max_document_bytes ({BOUND}) bytes"]
    assert _bad(tmp_path, "big.txt") == (expected, expected)
    assert _bad(tmp_path, "fits.txt") == ([], [])


def test_a_build_stops_on_a_record_over_the_bound_or_skips_it(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [{"id": f"d{i}", "text": f"document number {i}"} for i in range(5)]
    records[3]["text"] = "w" * 2000
    (corpus / "a.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    strict = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra_input='max_document_bytes = "1KB"\n')
    result = run_prep("build", strict, "--store", tmp_path / "store", "--workers", "1", "-q", check=False)
    assert result.returncode == 2
    assert _one_error_line(result.stderr).endswith(f"a.jsonl:4: the record is {len(json.dumps(records[3]))} bytes, "
                                                   "more than [input] max_document_bytes (1000)")
    assert not (tmp_path / "store" / "refs").exists() or not any((tmp_path / "store" / "refs").rglob("*"))
    skipping = write_pipeline(tmp_path, tokenizer_path, ["corpus"], name="skip.toml",
                              extra_input='max_document_bytes = "1KB"\non_error = "skip"\n')
    built = run_prep("build", skipping, "--store", tmp_path / "store", "--workers", "1", "-q", "--json")
    snapshot = load_snapshot(LocalStore(tmp_path / "store"), json.loads(built.stdout)["snapshot"])
    assert snapshot.manifest["stats"]["bad_records_skipped"] == 1
