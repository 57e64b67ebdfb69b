"""prep's WebDataset shards read back by the real consumers: `webdataset` and Hugging Face `datasets`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from prep.formats import wds
from prep.formats.wds import Sample

TEXTS = [
    "plain ascii",
    "",
    "Grüße, 世界! Ελληνικά — emoji 🚀🧪, combining e\u0301, RTL עברית",
    "line one\nline two\r\nwith\ttabs and a NUL \x00 inside",
    "large " * 200_000,
    "",
]


def _shard(tmp_path: Path, dtype: np.dtype) -> tuple[Path, list[Sample], list[np.ndarray]]:
    rng = np.random.default_rng(3)
    high = 65_535 if dtype == np.uint16 else 2**31 - 1
    tokens = [rng.integers(0, high, size=len(text) // 3, endpoint=True).astype(dtype) for text in TEXTS]
    shard = [
        Sample.build(1_000 + offset, f"doc-{offset}-ü", f"corpus/part-{offset}.jsonl", offset + 1, ids, text)
        for offset, (ids, text) in enumerate(zip(tokens, TEXTS))
    ]
    path = tmp_path / "shard-000000.tar"
    wds.write_shard(path, shard)
    return path, shard, tokens


def _expected_json(sample: Sample) -> dict[str, object]:
    loaded = json.loads(sample.json)
    assert isinstance(loaded, dict)
    return loaded


@pytest.mark.parametrize("dtype", [np.dtype("<u2"), np.dtype("<i4")], ids=str)
def test_webdataset_library_decodes_every_member(tmp_path: Path, dtype: np.dtype) -> None:
    webdataset = pytest.importorskip("webdataset")
    path, shard, tokens = _shard(tmp_path, dtype)

    read = list(webdataset.WebDataset(str(path), shardshuffle=False).decode())

    assert [item["__key__"] for item in read] == [sample.key for sample in shard]
    for item, sample, ids, text in zip(read, shard, tokens, TEXTS):
        assert item["tokens.npy"].dtype == dtype
        assert np.array_equal(item["tokens.npy"], ids)
        assert item["txt"] == text
        assert item["json"] == _expected_json(sample)
        assert item["json"]["tokens"] == len(ids)


def test_hugging_face_datasets_loads_the_shard(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    path, shard, tokens = _shard(tmp_path, np.dtype("<u2"))

    loaded = datasets.load_dataset(
        "webdataset", data_files={"train": str(path)}, split="train", cache_dir=str(tmp_path / "hf-cache")
    )

    assert loaded.num_rows == len(shard)
    for row, sample, ids, text in zip(loaded, shard, tokens, TEXTS):
        assert row["__key__"] == sample.key
        assert row["txt"] == text
        assert row["json"] == _expected_json(sample)
        assert row["tokens.npy"] == ids.tolist()
