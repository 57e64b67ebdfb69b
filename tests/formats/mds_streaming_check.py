"""Run by tests/formats/test_mds.py with mosaicml-streaming's own python (PREP_MDS_PYTHON), never by pytest.

One run (torch loads once) does a JOB file's work: for each of its `write` specs (dtype, size_limit,
shards of samples, out, and `metadata`: whether samples have a `json` metadata column), streaming's
`MDSWriter` writes each shard into out/<k>/ (shard.00000.mds and index.json), to compare bytes
with; then, for each folder DIR of `read`, it prints what `StreamingDataset(local=DIR, remote=None,
shuffle=False, batch_size=1)` yields, in order: per sample the `tokens` array's values and dtype,
the `text` and the `id`, each with its Python type, and the `metadata` object of a shard that has
the column, as JSON; and for each `decode` spec (a shard file, its `index.json` object and byte
ranges of it), what streaming's MDSReader decodes each range to, under `decoded`.

Imports nothing of prep. It loads `streaming.base`, where StreamingDataset, MDSWriter and the MDS
encodings live, without running `streaming/__init__.py`: that one imports `streaming.vision` and so
torchvision, whose PyPI build needs CUDA torch libraries a CPU-only torch does not have.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np


@functools.cache
def _streaming_base() -> Any:
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("mosaicml-streaming is not installed in this python")
    package = types.ModuleType("streaming")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["streaming"] = package
    import streaming.base

    return streaming.base


def _values(sample: dict[str, Any]) -> dict[str, Any]:
    """A decoded sample as JSON values."""
    return {"dtype": sample["tokens"].dtype.str, "id": sample["id"], "text": sample["text"],
            "tokens": sample["tokens"].tolist(),
            "types": [type(sample[column]).__name__ for column in ("tokens", "text", "id")],
            **({"metadata": sample["metadata"]} if "metadata" in sample else {})}


def read(folder: str) -> list[dict[str, Any]]:
    """Every sample StreamingDataset gives for `folder`, in order, as JSON values."""
    dataset = _streaming_base().StreamingDataset(local=folder, remote=None, shuffle=False, batch_size=1)
    return [_values(sample) for sample in dataset]


def decode(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples of byte ranges of one shard file, each decoded on its own by streaming's
    MDSReader made from the shard's `index.json` object (`spec`: file, shard, ranges)."""
    _streaming_base()
    from streaming.base.format.mds.reader import MDSReader

    reader = MDSReader.from_json(str(Path(spec["file"]).parent), None, spec["shard"])
    data = Path(spec["file"]).read_bytes()
    return [_values(reader.decode_sample(data[offset:offset + length])) for offset, length in spec["ranges"]]


def write(spec: dict[str, Any]) -> None:
    """Write each shard of `spec` with MDSWriter into its own folder `spec["out"]/<k>`."""
    columns = {"id": "str", "text": "str", "tokens": f"ndarray:{spec['dtype']}"}
    if spec.get("metadata"):
        columns["metadata"] = "json"
    for number, samples in enumerate(spec["shards"]):
        with _streaming_base().MDSWriter(out=str(Path(spec["out"]) / str(number)), columns=columns,
                                         compression=None, hashes=[], size_limit=spec["size_limit"]) as writer:
            for sample in samples:
                extra = {"metadata": sample["metadata"]} if spec.get("metadata") else {}
                writer.write({"id": sample["id"], "text": sample["text"],
                              "tokens": np.array(sample["tokens"], dtype=spec["dtype"]), **extra})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: mds_streaming_check.py JOB.json")
    job = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    for spec in job["write"]:
        write(spec)
    decoded = {"decoded": [decode(spec) for spec in job["decode"]]} if "decode" in job else {}
    print(json.dumps({**{folder: read(folder) for folder in job["read"]}, **decoded}))
