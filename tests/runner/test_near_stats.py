"""What a build with [dedup.near] records of it (issue 42): the cluster size distribution in the
cluster task's summary, the near_clusters stage manifest and the snapshot's stats equals the one
counted in plain Python from the drops object (and, without verify, the planted clusters); the
candidate pairs equal those the pairs objects hold; a build without [dedup.near] records none of
it; and a cluster task record whose sizes do not add up stops a build that reuses it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.errors import IntegrityError
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.storage.local import LocalStore
from prep.store.localcopy import local_file
from prep.store.records import TaskRecord, read_stage
from prep.workfiles.drops import open_drops
from prep.workfiles.pairs import read_pairs
from tests.helpers import committed_records, run_prep, unpack
from tests.neardup.nearstatsupport import PLANTED_SIZES, plain_distribution, sizes_of_drops, write_sized_corpus
from tests.runner.buildsupport import InProcessExecutor

Built = dict[str, tuple[Path, BuildResult]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Built:
    """The sized-cluster corpus built with verify, without it, and without [dedup.near], each in its own store."""
    root = tmp_path_factory.mktemp("nearstats")
    found = {}
    for name, near, verify in (("verify", True, True), ("plain", True, False), ("none", False, False)):
        write_sized_corpus(root, tokenizer_path, verify=verify, near=near, name=f"{name}.toml")
        store = root / f"store-{name}"
        found[name] = store, build(load_pipeline(root / f"{name}.toml"), LocalStore(store), InProcessExecutor(), (),
                                   Progress(quiet=True))
    return found


def stage_of(store: Path, result: BuildResult, name: str) -> dict[str, Any]:
    """The committed output manifest of stage `name` of the snapshot."""
    run = next(run for run in result.snapshot.manifest["stages"] if run["name"] == name)
    manifest = read_stage(LocalStore(store), name, run["key"])
    assert manifest is not None
    return manifest


def only_task(store: Path, stage: str) -> dict[str, Any]:
    """The summary of the one task record of `stage` in a store that built once."""
    [record] = committed_records(LocalStore(store), stage).values()
    return TaskRecord.from_json(record, stage).summary


@pytest.mark.parametrize("name", ["verify", "plain"])
def test_the_size_distribution_is_the_one_the_drops_object_gives(built: Built, name: str) -> None:
    store, result = built[name]
    stage = stage_of(store, result, "near_clusters")
    records = open_drops(local_file(LocalStore(store), stage["drops"])).read_all()
    sizes = sizes_of_drops(records["representative"].tolist())
    expected = plain_distribution(sizes)
    stats = result.snapshot.manifest["stats"]
    near = stats["near_clusters"]
    assert {"largest": near["largest"], "sizes": near["sizes"]} == expected
    assert near["clusters"] == len(sizes) == stage["clusters"] and near["dropped"] == len(records) == stage["dropped"]
    assert {key: stage[key] for key in ("largest", "sizes")} == expected
    assert only_task(store, "near_clusters") == {"dropped": len(records), "clusters": len(sizes), **expected}
    assert near["dropped"] == stats["near_duplicates_dropped"] + stats["duplicates_dropped"]  # every exact copy is in a cluster
    validate(result.snapshot.manifest, "prep.snapshot/1", name)
    validate(stage, "prep.stage/1", name)


def test_without_verify_the_distribution_is_the_planted_one(built: Built) -> None:
    _, result = built["plain"]
    assert max(PLANTED_SIZES) >= 17  # five bins, one of them empty of no cluster: the table's widths are exercised
    near = result.snapshot.manifest["stats"]["near_clusters"]
    assert {"largest": near["largest"], "sizes": near["sizes"]} == plain_distribution(PLANTED_SIZES)


@pytest.mark.parametrize("name", ["verify", "plain"])
def test_the_candidate_pairs_are_those_the_pairs_objects_hold(built: Built, name: str) -> None:
    store, result = built[name]
    stage = stage_of(store, result, "near_buckets")
    held = [len(read_pairs(local_file(LocalStore(store), bucket["pairs"])).left) for bucket in stage["buckets"]]
    near = result.snapshot.manifest["stats"]["near_clusters"]
    assert near["pairs"] == sum(held) == sum(bucket["count"] for bucket in stage["buckets"]) > 0
    validate(stage, "prep.stage/1", name)
    rejected = [bucket.get("rejected") for bucket in stage["buckets"]]
    if name == "plain":
        assert "pairs_rejected" not in near and rejected == [None] * len(rejected)
    else:
        assert near["pairs_rejected"] == sum(rejected) > 0  # copies edited apart from each other fail verify


def test_verify_rejects_what_joins_clusters_without_it(built: Built) -> None:
    verified = built["verify"][1].snapshot.manifest["stats"]["near_clusters"]
    plain = built["plain"][1].snapshot.manifest["stats"]["near_clusters"]
    assert verified["dropped"] <= plain["dropped"] and verified["pairs"] <= plain["pairs"]


def test_a_build_without_near_dedup_records_none_of_it(built: Built) -> None:
    store, result = built["none"]
    stats = result.snapshot.manifest["stats"]
    assert not [key for key in stats if key.startswith("near")]
    assert {run["name"] for run in result.snapshot.manifest["stages"]} == {"tokenize", "order", "shard"}
    assert not (store / "tasks" / "near_clusters").exists()


@pytest.mark.parametrize("change", ["clusters", "bins"])
def test_a_cluster_record_whose_sizes_do_not_add_up_stops_the_build_that_reuses_it(
        built: Built, tmp_path: Path, change: str) -> None:
    """The cluster task is reused by a build with other output settings; its record edited so the
    bins lose a cluster (or are not the log2 bins) is a corrupt store: exit 3 naming the task."""
    store, _ = built["plain"]
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    unpack(copy, "near_clusters")  # an edit inside a pack would break its hash: the pack would be ignored
    [path] = (copy / "tasks" / "near_clusters").glob("*.json")
    record = json.loads(path.read_text())
    if change == "clusters":
        record["summary"]["sizes"][0]["clusters"] += 1
    else:
        record["summary"]["sizes"][1]["min"] = 4
    path.chmod(0o644)
    path.write_text(json.dumps(record))
    pipeline = (store.parent / "plain.toml").read_text().replace('shard_size = "16KB"', 'shard_size = "32KB"')
    (tmp_path / "other.toml").write_text(pipeline.replace('"corpus/', f'"{store.parent}/corpus/'))
    failed = run_prep("build", tmp_path / "other.toml", "--store", copy, check=False)
    assert failed.returncode == 3, failed.stderr
    assert path.stem in failed.stderr and "prep: error:" in failed.stderr


@pytest.mark.parametrize("name", ["verify", "plain"])
def test_the_near_task_records_validate_and_the_schema_refuses_a_summary_without_sizes(built: Built, name: str) -> None:
    store, _ = built[name]
    stages = ("near_buckets", "near_route", "near_round", "near_drops", "near_clusters")
    found = [(f"{stage}/{key}", record) for stage in stages
             for key, record in committed_records(LocalStore(store), stage).items()]
    assert {where.split("/")[0] for where, _ in found} == set(stages)
    for path, record in found:
        validate(record, "prep.task/1", str(path))
        assert ("rejected" in record["summary"]) == (record["stage"] == "near_buckets" and name == "verify")
        if record["stage"] in ("near_drops", "near_clusters"):
            del record["summary"]["sizes"]
            with pytest.raises(IntegrityError):
                validate(record, "prep.task/1", str(path))


def test_a_large_star_round_record_must_say_whether_its_range_settled(built: Built) -> None:
    """fsck checks records by their schema: a large-star round record without `settled` is
    invalid, so it cannot pass for a small-star one."""
    store, _ = built["plain"]
    records = list(committed_records(LocalStore(store), "near_round").values())
    large = next(record for record in records if record["summary"]["large"])
    validate(large, "prep.task/1", "large-star record")
    del large["summary"]["settled"]
    with pytest.raises(IntegrityError):
        validate(large, "prep.task/1", "large-star record without settled")
    large["summary"]["large"] = False
    validate(large, "prep.task/1", "a small-star record")
