"""What `prep show` and `prep diff` print of near-duplicate removal (issue 42), through the real
CLI: the near-dup line and cluster size table match the manifest's stats, `--json` carries them
and validates, and a diff shows how the counts and sizes moved, also against a snapshot built
without [dedup.near] (and one without is shown as before)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prep.manifest.schema import validate
from tests.helpers import run_prep
from tests.neardup.nearstatsupport import write_sized_corpus

Tagged = tuple[Path, dict[str, dict[str, Any]]]


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Tagged:
    """One store with the sized-cluster corpus built with verify (tiny@verify), without it
    (tiny@plain) and without [dedup.near] (tiny@none); each snapshot's manifest."""
    root = tmp_path_factory.mktemp("nearcli")
    store = root / "store"
    manifests = {}
    for name, near, verify in (("verify", True, True), ("plain", True, False), ("none", False, False)):
        pipeline = root / f"{name}.toml"
        write_sized_corpus(root, tokenizer_path, verify=verify, near=near, name=pipeline.name)
        run_prep("build", pipeline, "--store", store, "--tag", name)
        manifests[name] = json.loads(run_prep("show", f"tiny@{name}", "--store", store, "--json").stdout)
    return store, manifests


def table(lines: list[str], first: str) -> dict[str, list[str]]:
    """The rows of the size table whose `size` row follows the line starting with `first`, by row name."""
    at = next(index for index, line in enumerate(lines) if line.startswith(first)) + 1
    rows = {}
    for line in lines[at:]:
        if not line.startswith("  "):
            break
        name, *cells = line.split()
        rows[name] = cells
    return rows


def labels(near: dict[str, Any]) -> list[str]:
    return [str(item["max"]) if item["min"] == item["max"] else f"{item['min']}-{item['max']}" for item in near["sizes"]]


@pytest.mark.parametrize("name", ["verify", "plain"])
def test_show_prints_the_clusters_and_their_sizes(tagged: Tagged, name: str) -> None:
    store, manifests = tagged
    stats = manifests[name]["stats"]
    near = stats["near_clusters"]
    lines = run_prep("show", f"tiny@{name}", "--store", store).stdout.splitlines()
    [line] = [line for line in lines if line.startswith("near-dup ")]
    exact = near["dropped"] - stats["near_duplicates_dropped"]
    assert (f"{near['clusters']} clusters of {near['clusters'] + near['dropped']} documents, largest {near['largest']}: "
            f"{near['dropped']} duplicates ({exact} removed by exact dedup first); {near['pairs']} candidate pairs") in line
    assert line.endswith(f", {near['pairs_rejected']} rejected by verify" if name == "verify" else " candidate pairs")
    rows = table(lines, "near-dup ")
    assert rows == {"size": labels(near), "clusters": [str(item["clusters"]) for item in near["sizes"]]}
    assert f"{stats['near_duplicates_dropped']} near duplicates dropped" in next(x for x in lines if x.startswith("documents"))


def test_show_json_is_the_manifest_with_the_near_stats(tagged: Tagged) -> None:
    _, manifests = tagged
    for name, manifest in manifests.items():
        validate(manifest, "prep.snapshot/1", f"show tiny@{name} --json")
        assert ("near_clusters" in manifest["stats"]) == (name != "none")


def test_show_of_a_build_without_near_dedup_has_no_near_line(tagged: Tagged) -> None:
    store, _ = tagged
    out = run_prep("show", "tiny@none", "--store", store).stdout
    assert "near" not in out and "clusters" not in out


def test_diff_shows_how_the_near_counts_and_sizes_moved(tagged: Tagged) -> None:
    store, manifests = tagged
    old, new = (manifests[name]["stats"]["near_clusters"] for name in ("verify", "plain"))
    assert old["sizes"] != new["sizes"]  # verify split a cluster: the table has something to show
    lines = run_prep("diff", "tiny@verify", "tiny@plain", "--store", store, check=False).stdout.splitlines()
    stats = next(line for line in lines if line.startswith("stats "))
    if old["dropped"] != new["dropped"]:
        assert f"near_clusters.dropped {old['dropped']} -> {new['dropped']} ({new['dropped'] - old['dropped']:+d})" in stats
    assert f"near_clusters.pairs_rejected {old['pairs_rejected']} -> (absent) ({-old['pairs_rejected']:+d})" in stats
    assert "near_clusters.sizes" not in stats  # the sizes are in the table
    rows = table(lines, "near-dup ")
    bins = sorted({item["max"] for item in old["sizes"] + new["sizes"]})
    by_bin = [{item["max"]: str(item["clusters"]) for item in side["sizes"]} for side in (old, new)]
    assert rows["old"] == [by_bin[0].get(largest, "0") for largest in bins]
    assert rows["new"] == [by_bin[1].get(largest, "0") for largest in bins]


def test_diff_against_a_build_without_near_dedup(tagged: Tagged) -> None:
    store, manifests = tagged
    near = manifests["plain"]["stats"]["near_clusters"]
    for old, new in (("none", "plain"), ("plain", "none")):
        lines = run_prep("diff", f"tiny@{old}", f"tiny@{new}", "--store", store, check=False).stdout.splitlines()
        stats = next(line for line in lines if line.startswith("stats "))
        sides = (f"(absent) -> {near['clusters']}", f"{near['clusters']} -> (absent)")[old == "plain"]
        assert f"near_clusters.clusters {sides}" in stats
        rows = table(lines, "near-dup ")
        absent, present = ("old", "new") if old == "none" else ("new", "old")
        assert rows == {"size": labels(near), absent: ["-"] * len(near["sizes"]),
                        present: [str(item["clusters"]) for item in near["sizes"]]}


def test_diff_of_two_builds_without_near_dedup_has_no_near_table(tagged: Tagged) -> None:
    store, _ = tagged
    out = run_prep("diff", "tiny@none", "tiny@none", "--store", store).stdout
    assert "near" not in out


@pytest.mark.parametrize(("old", "new"), [("verify", "plain"), ("none", "plain"), ("plain", "none")])
def test_diff_json_carries_every_near_count_and_size(tagged: Tagged, old: str, new: str) -> None:
    store, manifests = tagged
    report = json.loads(run_prep("diff", f"tiny@{old}", f"tiny@{new}", "--store", store, "--json",
                                 check=False).stdout)
    validate(report, "prep.diff-report/1", "diff --json")
    entries = {entry["key"]: entry for entry in report["stats"]}
    for side, name in (("old", old), ("new", new)):
        near = manifests[name]["stats"].get("near_clusters")
        found = {key: entry[side] for key, entry in entries.items()
                 if key.startswith("near_clusters.sizes[") and side in entry}
        expected = {} if near is None else {f"near_clusters.sizes[{item['min']}-{item['max']}]": item["clusters"]
                                            for item in near["sizes"]}
        assert found == expected
        assert entries["near_clusters.clusters"].get(side) == (None if near is None else near["clusters"])
        assert entries["near_clusters.largest"].get(side) == (None if near is None else near["largest"])
