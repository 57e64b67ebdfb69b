"""`[input] metadata_fields` end to end: a JSON Lines and a Parquet corpus built to bin, mds and wds
carry every kept document's metadata into its WebDataset `.json` member (read with `webdataset`),
its MDS sample (read back by prep's reader and by mosaicml-streaming) and its row of the shard's
`.metadata.parquet` (read with pyarrow and `datasets`, row i the .bin's document i); the same
snapshot on 1, 2 and 3 workers; a flipped byte of a metadata file is caught by verify, fsck and pull."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from prep.cli.main import cli
from prep.config import load_pipeline
from prep.formats.mds_reader import ShardReader
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.storage.local import LocalStore
from prep.store.cas import object_key
from prep.store.fsck import fsck
from tests.formats.test_golden import WORDS, word_tokenizer
from tests.formats.test_mds import _run_checker, _streaming_python
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, artifact_path, build_local, read_samples, read_sequences

FIELDS = ["url", "license", "source"]
FORMATS = '["bin", "mds", "wds"]'


def _text(seed: int) -> str:
    return " ".join(WORDS[(seed * 31 + k * 7) % len(WORDS)] for k in range(seed % 17 + 1))


def _license(index: int) -> Any:
    """Every kind of JSON value, and escapes: quotes, backslashes, control and non-ASCII characters."""
    kinds: list[Any] = [None, "MIT", 3, -2.5, 1e-300, True, [1, "two", None], {"z": {"ü": "\"\\\n"}, "a": []},
                        "日本語 😀 \u2028", 10**30]
    return kinds[index % len(kinds)]


def records(count: int) -> list[dict[str, Any]]:
    """Documents with metadata fields present, missing and null; every fifth repeats an earlier text."""
    found = []
    for index in range(count):
        record: dict[str, Any] = {"id": f"doc-{index}", "text": _text(index // 5 * 3 if index % 5 == 4 else index),
                                  "url": f"https://example.org/{index}?q=\"x\"\\y", "license": _license(index)}
        if index % 3:
            record["source"] = {"name": f"crawl-{index % 4}", "score": index / 7}
        found.append(record)
    return found


def expected_metadata(record: dict[str, Any]) -> dict[str, Any]:
    return {field: record[field] for field in FIELDS if record.get(field) is not None}


def build_corpus(root: Path, corpus: list[dict[str, Any]], parquet: bool = False, workers: int = 0) -> BuildResult:
    """The corpus as JSON Lines (or Parquet) built with metadata fields to bin, mds and wds; in this
    process, or on `workers` spawned workers."""
    if parquet:
        (root / "corpus").mkdir(parents=True)
        table = pa.table({"id": [r["id"] for r in corpus], "text": [r["text"] for r in corpus],
                          "url": [r["url"] for r in corpus],
                          "source": [r.get("source") for r in corpus]})  # `license` is not a column: absent
        pq.write_table(table, root / "corpus" / "part.parquet", row_group_size=7)
    else:
        write_jsonl(root / "corpus" / "a.jsonl", corpus[: len(corpus) // 2])
        write_jsonl(root / "corpus" / "b.jsonl", corpus[len(corpus) // 2:])
    pipeline = write_pipeline(root, word_tokenizer(root / "tokenizer.json", 1000), ["corpus"], shard_size="300B",
                              formats=FORMATS, extra_input=f"metadata_fields = {json.dumps(FIELDS)}\n")
    if workers:
        return build_local(pipeline, root / "store", workers)
    return build(load_pipeline(pipeline), LocalStore(root / "store"), InProcessExecutor(), (), Progress(quiet=True))


def by_format(result: BuildResult, fmt: str) -> list[dict[str, Any]]:
    return sorted((a for a in result.snapshot.artifacts if a["format"] == fmt), key=lambda a: a["path"])


def kept_ids(corpus: list[dict[str, Any]]) -> list[str]:
    """The ids dedup keeps: the first document of each text."""
    seen: dict[str, str] = {}
    for record in corpus:
        seen.setdefault(record["text"], record["id"])
    return sorted(seen.values())


@pytest.mark.parametrize("parquet", [False, True], ids=["jsonl", "parquet"])
def test_every_format_carries_each_kept_documents_metadata(tmp_path: Path, parquet: bool) -> None:
    corpus = records(60)
    result = build_corpus(tmp_path, corpus, parquet)
    store = tmp_path / "store"
    by_id = {record["id"]: record for record in corpus}
    if parquet:
        by_id = {key: {**record, "license": None} for key, record in by_id.items()}
    members = [json.loads(sample["json"]) for _, sample in read_samples(store, result.snapshot.manifest)]
    assert sorted(member["id"] for member in members) == kept_ids(corpus)
    assert len(by_format(result, "bin")) > 1, "several shards"
    for member in members:
        assert member["metadata"] == expected_metadata(by_id[member["id"]])
        assert list(member) == ["id", "line", "metadata", "source", "tokens"]
    rows = [row for a in by_format(result, "bin_metadata") for row in pq.read_table(artifact_path(store, a)).to_pylist()]
    assert [row["id"] for row in rows] == [member["id"] for member in members], "row i is document i of the .bin"
    assert len(rows) == len(read_sequences(store, result.snapshot.manifest))
    for row, member in zip(rows, members):
        assert {key: json.loads(value) for key, value in row.items() if key != "id" and value is not None} \
            == member["metadata"]
    assert [a["documents"] for a in by_format(result, "bin_metadata")] == [
        pq.ParquetFile(artifact_path(store, a)).metadata.num_rows for a in by_format(result, "bin_metadata")]
    samples = [sample for a in by_format(result, "mds") for sample in ShardReader(artifact_path(store, a))]
    assert [(s.id, json.loads(s.metadata or b"")) for s in samples] == [(m["id"], m["metadata"]) for m in members]


def test_webdataset_and_datasets_read_what_prep_wrote(tmp_path: Path) -> None:
    import datasets
    import webdataset

    corpus = records(40)
    result = build_corpus(tmp_path, corpus)
    store = tmp_path / "store"
    tars = [str(artifact_path(store, a)) for a in by_format(result, "wds")]
    read = [json.loads(sample["json"]) for sample in webdataset.WebDataset(tars, shardshuffle=False)]
    by_id = {record["id"]: record for record in corpus}
    assert read and all(member["metadata"] == expected_metadata(by_id[member["id"]]) for member in read)
    files = [str(artifact_path(store, a)) for a in by_format(result, "bin_metadata")]
    table = datasets.Dataset.from_parquet(files, cache_dir=str(tmp_path / "hf"))
    assert table.column_names == ["id", *FIELDS]
    assert table["id"] == [member["id"] for member in read]


def test_the_same_snapshot_on_one_two_and_three_workers(tmp_path: Path) -> None:
    corpus = records(80)
    ids = {build_corpus(tmp_path / str(workers), corpus, workers=workers).snapshot.id for workers in (1, 2, 3)}
    assert len(ids) == 1


def test_the_metadata_file_is_an_artifact_verify_fsck_and_pull_check(tmp_path: Path) -> None:
    result = build_corpus(tmp_path, records(30))
    store, snap = tmp_path / "store", result.snapshot.id
    meta = by_format(result, "bin_metadata")[0]
    assert meta["path"].endswith(".metadata.parquet") and meta["path"].startswith("bin/")
    runner = CliRunner()
    assert runner.invoke(cli, ["pull", snap, str(tmp_path / "dest"), "--store", str(store)]).exit_code == 0
    pulled = tmp_path / "dest" / meta["path"]
    pulled.write_bytes(_flipped(pulled.read_bytes()))
    verified = runner.invoke(cli, ["verify", snap, str(tmp_path / "dest"), "--store", str(store), "--json"])
    assert verified.exit_code == 1 and meta["path"] in verified.output
    stored = store / object_key(meta["sha256"])
    stored.chmod(0o644)
    stored.write_bytes(_flipped(stored.read_bytes()))
    assert object_key(meta["sha256"]) in {finding.key for finding in fsck(LocalStore(store)).findings}
    pulled_again = runner.invoke(cli, ["pull", snap, str(tmp_path / "again"), "--store", str(store)])
    assert pulled_again.exit_code != 0 and meta["sha256"][:12] in pulled_again.output + str(pulled_again.exception)


def _flipped(data: bytes) -> bytes:
    changed = bytearray(data)
    changed[len(changed) // 2] ^= 0x01
    return bytes(changed)


def test_streaming_reads_the_metadata_column(tmp_path: Path) -> None:
    python = _streaming_python()
    corpus = records(30)
    result = build_corpus(tmp_path, corpus)
    store, snap = tmp_path / "store", result.snapshot.id
    assert CliRunner().invoke(cli, ["pull", snap, str(tmp_path / "dest"), "--store", str(store),
                                    "--formats", "mds"]).exit_code == 0
    read = _run_checker(python, {"read": [str(tmp_path / "dest" / "mds")], "write": []}, tmp_path)
    by_id = {record["id"]: record for record in corpus}
    lines = read[str(tmp_path / "dest" / "mds")]
    assert sorted(line["id"] for line in lines) == kept_ids(corpus)
    assert all(line["metadata"] == expected_metadata(by_id[line["id"]]) for line in lines)
