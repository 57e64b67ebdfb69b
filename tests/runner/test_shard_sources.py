"""The mix of input files in each shard (issue 43): what every shard's task records and the shard
stage manifest lists equals the count of the `.json` members read back from its tar (each names
its source file); the snapshot's `stats.shard_sources` is their aggregate; every shard mixes
every file in about its share of the corpus (shards are key ranges over a keyed permutation); and
a shard record without a usable mix stops the build that reuses it."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.errors import IntegrityError
from prep.formats import wds
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.quality.sourcemix import TOP_SOURCES, SourceMix, shard_sources
from prep.runner import ordering
from prep.runner.build import BuildResult, build
from prep.stages import read, shard
from prep.storage.local import LocalStore
from tests.helpers import committed_records, make_records, unpack, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, artifact_path
from tests.runner.test_near_stats import stage_of

FILES = {"a.jsonl": 960, "b.jsonl": 480, "c.jsonl": 240, "sub/d.jsonl": 120}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, BuildResult]:
    """Four files of 960, 480, 240 and 120 records, each read in several parts, ordered in several
    buckets and written in shards of a few windows each (so a shard's count spans parts, buckets
    and windows)."""
    root = tmp_path_factory.mktemp("shard-sources")
    for seed, (name, count) in enumerate(FILES.items()):
        write_jsonl(root / "corpus" / name, make_records(count, seed=seed, prefix=name.split(".")[0]))
    pipeline = write_pipeline(root, tokenizer_path, ["corpus"], shard_size="24KB")
    return root / "store", build_small(pipeline, root / "store")


def build_small(pipeline: Path, store: Path) -> BuildResult:
    """Build in this process with parts of 6 kB, buckets of 200 documents and windows of 16."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(read, "RANGE_BYTES", 6000)
        patch.setattr(ordering, "DOCUMENTS_PER_BUCKET", 200)
        patch.setattr(shard, "WINDOW_DOCUMENTS", 16)
        return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


def read_back_counts(store: Path, result: BuildResult) -> dict[int, Counter[int]]:
    """Per shard index, its documents per input file (index in stats.files), from its tar's `.json` members."""
    index_of = {entry["path"]: index for index, entry in enumerate(result.snapshot.manifest["stats"]["files"])}
    counts: dict[int, Counter[int]] = {}
    for artifact in result.snapshot.artifacts:
        if artifact["format"] == "wds":
            members = (json.loads(sample["json"]) for _, sample in wds.iter_samples(artifact_path(store, artifact)))
            counts[artifact["shard"]] = Counter(index_of[member["source"]] for member in members)
    return counts


def plain_mix(counts: Counter[int]) -> dict[str, Any]:
    """The mix as counted in plain Python: most documents first, ties the lower file index."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:TOP_SOURCES]
    return {"distinct": len(counts), "top": [[index, documents] for index, documents in ranked]}


def test_each_shards_mix_is_the_count_of_its_documents_read_back(built: tuple[Path, BuildResult]) -> None:
    store, result = built
    counts = read_back_counts(store, result)
    stage = stage_of(store, result, "shard")
    validate(stage, "prep.stage/1", "shard stage")
    assert len(stage["shards"]) == len(counts) >= 6
    for entry in stage["shards"]:
        assert entry["sources"] == plain_mix(counts[entry["index"]]), entry["name"]
        assert sum(counts[entry["index"]].values()) == entry["documents"]
    records = list(committed_records(LocalStore(store), "shard").values())
    assert len(records) == 2 * len(counts)  # a bin and a wds unit a shard: each records its shard's mix
    by_mix = Counter(json.dumps(record["summary"]["sources"]) for record in records)
    assert sorted(by_mix.values()) == [2] * len(counts)
    for record in records:
        validate(record, "prep.task/1", "shard record")


def test_the_stats_hold_the_aggregate_of_the_shards_mixes(built: tuple[Path, BuildResult]) -> None:
    store, result = built
    manifest = result.snapshot.manifest
    validate(manifest, "prep.snapshot/1", "snapshot")
    counts = read_back_counts(store, result)
    sources = manifest["stats"]["shard_sources"]
    expected = shard_sources([(sum(c.values()), SourceMix.from_json(plain_mix(c))) for c in counts.values()],
                             [entry["documents_written"] for entry in manifest["stats"]["files"]])
    assert sources == expected
    assert sources["shards"] == len(counts) and sources["files_written"] == len(FILES)
    assert sources["largest_file"]["file"] == 0 and sum(b["shards"] for b in sources["largest_share"]) == len(counts)


def test_every_shard_mixes_every_file_in_about_its_share(built: tuple[Path, BuildResult]) -> None:
    """Keys are a keyed permutation of text hashes: a shard's count of each file is a binomial draw
    at that file's share of the corpus (within 4 standard deviations), and a shard of 10 or more
    expected documents of every file holds them all, its largest source the largest file."""
    store, result = built
    files = result.snapshot.manifest["stats"]["files"]
    written = [entry["documents_written"] for entry in files]
    shares = [count / sum(written) for count in written]
    large = 0
    for index, counts in read_back_counts(store, result).items():
        documents = sum(counts.values())
        for file, share in enumerate(shares):
            mean = documents * share
            assert abs(counts[file] - mean) <= 4 * math.sqrt(mean * (1 - share)) + 1, (index, file, counts)
        if documents * min(shares) >= 10:
            large += 1
            assert len(counts) == len(FILES) and counts.most_common(1)[0][0] == 0, (index, counts)
    assert large >= 4, [sum(c.values()) for c in read_back_counts(store, result).values()]
    distinct = result.snapshot.manifest["stats"]["shard_sources"]["distinct"]
    assert distinct[-1] == {"min": 4, "max": 7, "shards": distinct[-1]["shards"]} and distinct[-1]["shards"] >= 1


@pytest.mark.parametrize("change", ["dropped", "disagreeing"])
def test_a_shard_record_without_a_usable_mix_stops_the_build_that_reuses_it(
        built: tuple[Path, BuildResult], tmp_path: Path, change: str) -> None:
    """The shard stage is re-made from its task records (its stage record removed): a record whose
    mix is gone, or whose mix is not its sibling unit's, is a corrupt store: an IntegrityError
    (exit 3) naming it. (Edited by hand: the build reads the file only with no pack holding it.)"""
    store, _ = built
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    shutil.rmtree(copy / "stages" / "shard")
    unpack(copy, "shard")  # an edit inside a pack would break its hash: the pack would be ignored
    path = sorted((copy / "tasks" / "shard").glob("*.json"))[0]
    record = json.loads(path.read_text())
    if change == "dropped":
        del record["summary"]["sources"]
    else:
        record["summary"]["sources"]["top"][0][1] += 1
    path.write_text(json.dumps(record))
    with pytest.raises(IntegrityError, match="source") as failed:
        build_small(store.parent / "pipeline.toml", copy)
    assert (path.stem if change == "dropped" else "shard ") in str(failed.value)
