"""Hostile inputs through the real `prep build`: each is one `prep: error:` line naming the file or
key, exit 2, no traceback and nothing committed; or, where the input is fine, a build that reads
only the corpus."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline


def _parquet(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _footer_cut(corpus: Path) -> str:
    _parquet(corpus / "bad.parquet", pa.table({"id": ["a", "b"], "text": ["x", "y"]}))
    data = (corpus / "bad.parquet").read_bytes()
    (corpus / "bad.parquet").write_bytes(data[:-8] + (10**9).to_bytes(4, "little") + data[-4:])
    return "bad.parquet: cannot read: "


def _column_twice(corpus: Path) -> str:
    names = ["id", "text", "text"]
    _parquet(corpus / "two.parquet", pa.Table.from_arrays([pa.array(["a"]), pa.array(["x"]), pa.array(["y"])], names))
    return "two.parquet: column 'text' appears 2 times"


def _text_not_utf8(corpus: Path) -> str:
    values = [b"fine", b"also fine", b"bad \xff"]
    offsets = np.cumsum([0] + [len(v) for v in values]).astype("<i4")
    texts = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])
    _parquet(corpus / "t.parquet", pa.table({"id": ["a", "b", "c"], "text": texts}))
    return "t.parquet: row 2: text field 'text' is not valid UTF-8 (byte 4)"


def _state_json_file_number(corpus: Path) -> str:
    corpus.mkdir(parents=True)
    (corpus / "state.json").write_text(json.dumps({"_data_files": [{"filename": 5}]}))
    return "not a dataset saved with save_to_disk (state.json: a filename is 5, not a file name)"


def _dataset_dict(corpus: Path) -> str:
    for split in ("train", "test"):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "state.json").write_text('{"_data_files": [{"filename": "data.arrow"}]}')
        (corpus / split / "data.arrow").write_bytes(b"")
    (corpus / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    return "a DatasetDict saved with save_to_disk; name the folders of the splits to read (test, train)"


_BAD: dict[str, Callable[[Path], str]] = {
    "parquet footer past the file": _footer_cut, "parquet column named twice": _column_twice,
    "parquet text not UTF-8": _text_not_utf8, "state.json filename a number": _state_json_file_number,
    "DatasetDict folder": _dataset_dict,
}


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    [line] = [line for line in stderr.splitlines() if line.strip()]
    assert line.startswith("prep: error: "), line
    return line


@pytest.mark.parametrize("kind", sorted(_BAD))
def test_a_bad_input_is_one_error_line_and_commits_nothing(tmp_path: Path, tokenizer_path: Path, kind: str) -> None:
    needle = _BAD[kind](tmp_path / "corpus")
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    result = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1", "-q", check=False)
    assert result.returncode == 2, result.stderr
    assert needle in _one_error_line(result.stderr)
    assert not (tmp_path / "store" / "refs").exists() and not (tmp_path / "store" / "snapshots").exists()


def test_an_empty_input_path_is_a_config_error(tmp_path: Path, tokenizer_path: Path) -> None:
    """It named the pipeline's own folder, and the build read its store's lease as JSON Lines."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(5))
    pipeline = write_pipeline(tmp_path, tokenizer_path, [""])
    result = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1", "-q", check=False)
    assert result.returncode == 2
    assert _one_error_line(result.stderr) == f"prep: error: {pipeline}: input.paths[0]: expected a non-empty str, got ''"


def test_a_corpus_folder_holding_the_store_reads_only_the_corpus(tmp_path: Path, tokenizer_path: Path) -> None:
    """`paths = ["."]` beside the default store: the build's own lease and records are not inputs,
    on the first build or a rebuild."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(5))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["."])
    for _ in range(2):
        run_prep("build", pipeline, "--workers", "1", "-q", cwd=tmp_path)
    shown = json.loads(run_prep("show", "tiny@latest", "--json", cwd=tmp_path).stdout)
    assert [entry["path"] for entry in shown["inputs"]["files"]] == ["a.jsonl"]
