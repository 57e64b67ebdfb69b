"""Shards of a real build, opened by the real consumers: megatron-core, numpy.memmap,
webdataset and Hugging Face datasets (via `prep pull`-style copies under stable names)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import artifact_path, build_local, read_sequences


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, dict[str, Any], Path]:
    root = tmp_path_factory.mktemp("clients")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(80, seed=5))
    result = build_local(write_pipeline(root, tokenizer_path, shard_size="6KB"), root / "store", workers=2)
    named = root / "named"
    for artifact in result.snapshot.artifacts:
        target = named / artifact["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifact_path(root / "store", artifact), target)
    return root, result.snapshot.manifest, named


def test_megatron_core_indexed_dataset_reads_every_shard(built: tuple[Path, dict[str, Any], Path]) -> None:
    indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    root, manifest, named = built
    expected = read_sequences(root / "store", manifest)
    got: list[list[int]] = []
    for idx in sorted((named / "bin").glob("*.idx")):
        dataset = indexed_dataset.IndexedDataset(str(idx.with_suffix("")))
        assert dataset.document_indices.tolist() == list(range(len(dataset) + 1))
        got.extend(np.asarray(dataset[i]).tolist() for i in range(len(dataset)))
    assert got == [s.tolist() for s in expected]


def test_numpy_memmap_reads_bin_with_idx_pointers(built: tuple[Path, dict[str, Any], Path]) -> None:
    root, manifest, named = built
    from prep.formats.megatron import read_index

    total = 0
    for idx in sorted((named / "bin").glob("*.idx")):
        index = read_index(idx)
        tokens = np.memmap(idx.with_suffix(".bin"), dtype=index.dtype, mode="r")
        assert len(tokens) * tokens.itemsize == int(index.pointers[-1]) + int(index.lengths[-1]) * tokens.itemsize
        total += len(index.lengths)
    assert total == manifest["stats"]["documents_written"]


def test_webdataset_and_datasets_load_the_tars(built: tuple[Path, dict[str, Any], Path], tmp_path: Path) -> None:
    webdataset = pytest.importorskip("webdataset")
    datasets = pytest.importorskip("datasets")
    root, manifest, named = built
    tars = sorted(str(p) for p in (named / "wds").glob("*.tar"))
    sequences = read_sequences(root / "store", manifest)
    samples = list(webdataset.WebDataset(tars, shardshuffle=False).decode())
    assert len(samples) == len(sequences) == manifest["stats"]["documents_written"]
    for sample, sequence in zip(samples, sequences):
        assert sample["tokens.npy"].tolist() == sequence.tolist()
        assert sample["json"]["tokens"] == len(sequence)
    loaded = datasets.load_dataset("webdataset", data_files={"train": tars}, split="train",
                                   cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == len(samples)
    assert [row["txt"] for row in loaded] == [s["txt"] for s in samples]
    assert json.loads(json.dumps(loaded[0]["json"]))["id"] == samples[0]["json"]["id"]
