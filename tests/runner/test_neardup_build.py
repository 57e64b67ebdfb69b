"""Near-duplicate removal wired into the build (issue 42): planted near duplicates are removed,
the first of each cluster kept, verify joins no dissimilar documents, transitive chains spread
over several files and band buckets join whole, and the snapshot id is the same on any worker
count; a build killed in the signature, bucket or cluster stage replays to the same snapshot; an
appended file's signatures are the only ones computed again; bad settings stop the build before
any task."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.config import load_pipeline
from prep.hashing import parse_id
from prep.progress import Progress
from prep.runner import nearbuckets, nearrounds
from prep.runner.build import BuildResult, build
from prep.stages import neardedup
from prep.stages.neardedup import texts_by_number
from prep.storage.local import LocalStore
from prep.store.layout import object_key
from tests.helpers import committed_records, forget_commits, prep_env, run_prep, write_jsonl, write_pipeline
from tests.neardup.neardupsupport import (
    chain_drops,
    chained_files,
    is_chain,
    planted,
    snapshot_drops,
    snapshot_pairs,
    true_jaccard,
    write_files,
)
from tests.runner.buildsupport import InProcessExecutor, all_objects_intact, build_local
from tests.runner.test_reuse import flip_byte, object_path

FILES = 3
NEAR = '\n[dedup.near]\nthreshold = 0.7\nngram = 5\npermutations = 128\nbands = 32\nrows = 4\nverify = true\n'


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, list[list[str]]]:
    root = tmp_path_factory.mktemp("near")
    docs = planted(random.Random(11))
    bounds = [len(docs) * index // FILES for index in range(FILES + 1)]
    write_files(root, [docs[bounds[index]:bounds[index + 1]] for index in range(FILES)])
    write_pipeline(root, tokenizer_path, shard_size="8KB", extra=NEAR)
    return root, docs


def drops_of(store: Path, result: BuildResult, sizes: list[int]) -> dict[int, int]:
    """The snapshot's near-duplicate drops as corpus positions: dropped -> kept representative."""
    return snapshot_drops(store, result.snapshot.manifest, sizes)


def test_planted_near_duplicates_are_removed_keeping_the_first(corpus: tuple[Path, list[list[str]]]) -> None:
    root, docs = corpus
    result = build(load_pipeline(root / "pipeline.toml"), LocalStore(root / "store"), InProcessExecutor(), (),
                   Progress(quiet=True))
    sizes = [len(docs) * (i + 1) // FILES - len(docs) * i // FILES for i in range(FILES)]
    drops = drops_of(root / "store", result, sizes)
    similar = [(a, b) for a in range(len(docs)) for b in range(a + 1, len(docs)) if true_jaccard(docs[a], docs[b]) >= 0.9]
    assert similar and sum(b in drops for _, b in similar) >= 0.95 * len(similar)
    assert all(kept < dropped and kept not in drops for dropped, kept in drops.items())
    members: dict[int, list[int]] = {}
    for dropped, kept in drops.items():
        members.setdefault(kept, [kept]).append(dropped)
    assert all(true_jaccard(docs[a], docs[b]) >= 0.5 for group in members.values() for a in group for b in group)
    stats = result.snapshot.manifest["stats"]
    assert stats["near_duplicates_dropped"] + stats["duplicates_dropped"] == len(drops)
    assert stats["documents_written"] == len(docs) - len(drops)
    starts = np.cumsum([0, *sizes])
    assert [entry["duplicates_dropped"] + entry["near_duplicates_dropped"] for entry in stats["files"]] == \
        [sum(start <= dropped < end for dropped in drops) for start, end in zip(starts, starts[1:])]
    assert sum(entry["near_duplicates_dropped"] for entry in stats["files"]) == stats["near_duplicates_dropped"]


def test_the_same_snapshot_on_one_two_and_three_workers(corpus: tuple[Path, list[list[str]]]) -> None:
    root, _ = corpus
    ids = {build_local(root / "pipeline.toml", root / f"store-{workers}", workers).snapshot.id for workers in (1, 2, 3)}
    assert len(ids) == 1


def test_verify_in_slices_of_one_pair_builds_the_same_snapshot(corpus: tuple[Path, list[list[str]]],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify` reads a bucket's texts in slices of `VERIFY_BYTES`: at 1 byte every slice is one
    pair (two documents at most), and the snapshot, its rejected pair count included, is the same."""
    root, _ = corpus
    reads: list[int] = []

    def counted(intermediate_of: Any, numbers: Any) -> list[bytes]:
        reads.append(len(numbers))
        return texts_by_number(intermediate_of, numbers)

    monkeypatch.setattr(neardedup, "texts_by_number", counted)
    results = {}
    for budget in (neardedup.VERIFY_BYTES, 1):
        reads.clear()
        monkeypatch.setattr(neardedup, "VERIFY_BYTES", budget)
        results[budget] = build(load_pipeline(root / "pipeline.toml"), LocalStore(root / f"store-budget-{budget}"),
                                InProcessExecutor(), (), Progress(quiet=True))
        assert reads and (max(reads) <= 2) == (budget == 1)
    whole, sliced = results.values()
    assert whole.snapshot.manifest["stats"]["near_clusters"]["pairs_rejected"] > 0
    assert sliced.snapshot.manifest["stats"] == whole.snapshot.manifest["stats"]
    assert sliced.snapshot.id == whole.snapshot.id


@pytest.mark.parametrize(("setting", "key"), [("threshold = 1.5", "threshold"), ("ngram = 0", "ngram"),
                                              ("bands = 3\nrows = 5", "bands")])
def test_bad_settings_exit_2_naming_the_key(tmp_path: Path, tokenizer_path: Path, setting: str, key: str) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": "a", "text": "one two three"}])
    pipeline = write_pipeline(tmp_path, tokenizer_path, extra=f"\n[dedup.near]\n{setting}\n")
    failed = run_prep("build", pipeline, "--store", tmp_path / "store", check=False)
    assert failed.returncode == 2
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prep: error:") and f"dedup.near.{key}" in lines[0]
    assert not (tmp_path / "store" / "tasks").exists()


THRESHOLD = 0.7
# Three chains over three files (`chained_files`): chain 0 in input order, chain 1 with its middle
# link last (its third link joins the first only through a later document), chain 2 of four links
# with three in files after the first's. A fourth file appended later adds a fourth link to chain 0.
CHAINS = ("a0 . a1 . a2 .", ". b0 c1 . c2 d2 .", ". c0 . b1 b2 .")
APPENDED = ". d0 ."
BAND_RECORDS = 600
"""Band records a bucket task for the chain and crash tests: several band buckets, so that a
chain's pairs come from different bucket tasks."""


Chained = tuple[Path, list[list[list[str]]], list[list[int]]]
"""The chain corpus: its pipeline, every file's documents (the appended one's too), each chain's
positions in link order."""


def write_chains(folder: Path, tokenizer: Path) -> Chained:
    """The chain corpus's first three files (CHAINS) and its pipeline under `folder`; every file
    (the appended one too) and each chain's positions in link order."""
    files, chains = chained_files(random.Random(5), [*CHAINS, APPENDED])
    write_files(folder, files[:len(CHAINS)])
    return write_pipeline(folder, tokenizer, shard_size="64KB", extra=NEAR), files, chains


def sizes_of(files: list[list[list[str]]]) -> list[int]:
    """Documents a file (each file is one part here), in input order."""
    return [len(docs) for docs in files]


@pytest.fixture(scope="module")
def chained(tmp_path_factory: pytest.TempPathFactory,
            tokenizer_path: Path) -> Chained:
    """The chain corpus (write_chains): its pipeline, files and chains, after checking that every
    chain is one by the true Jaccard of its documents."""
    pipeline, files, chains = write_chains(tmp_path_factory.mktemp("chains"), tokenizer_path)
    docs = [words for file in files for words in file]
    assert all(is_chain(docs, links, THRESHOLD) for links in chains) and len(chains) == 3
    return pipeline, files, chains


def test_transitive_chains_join_whole_keeping_the_first_on_one_two_and_three_workers(
        chained: Chained, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chain (A~B, B~C, A!~C), its links in different files and its pairs in different band
    buckets, is one cluster that keeps its first link and drops the rest; the same snapshot on
    1, 2 and 3 workers, and the same drops with all bands in one bucket."""
    pipeline, files, chains = chained
    sizes = sizes_of(files[:len(CHAINS)])
    expected = chain_drops(chains, sum(sizes))
    assert len(expected) == 7
    monkeypatch.setattr(nearbuckets, "RECORDS_PER_BUCKET", BAND_RECORDS)
    results = {workers: build_local(pipeline, tmp_path / f"store-{workers}", workers) for workers in (1, 2, 3)}
    assert len({result.snapshot.id for result in results.values()}) == 1
    for workers, result in results.items():
        assert result.stages["near_buckets"].ran == 8
        assert drops_of(tmp_path / f"store-{workers}", result, sizes) == expected
        assert result.snapshot.manifest["stats"]["near_duplicates_dropped"] == len(expected)
    docs = [words for file in files for words in file]
    pairs = snapshot_pairs(tmp_path / "store-1", results[1].snapshot.manifest, sizes)
    assert all(true_jaccard(docs[a], docs[b]) >= THRESHOLD for a, b in pairs)  # verify let no A~C pair in
    assert all((links[0], links[2]) not in pairs for links in chains)  # so each chain is joined through B
    monkeypatch.setattr(nearbuckets, "RECORDS_PER_BUCKET", 1 << 30)
    one = build_local(pipeline, tmp_path / "one-bucket", 2)
    assert one.stages["near_buckets"].ran == 1 and drops_of(tmp_path / "one-bucket", one, sizes) == expected


def test_an_appended_file_computes_its_own_signatures_only_and_equals_a_fresh_build(
        chained: Chained, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebuild after appending a file (one with a fourth link of a chain) runs the new part's
    tokenize task (its signatures) only, every band bucket and the cluster task again, and ends
    at the snapshot a fresh build of the grown corpus makes."""
    pipeline, files, chains = chained
    shutil.copytree(pipeline.parent / "corpus", tmp_path / "corpus")
    grown = Path(shutil.copy(pipeline, tmp_path / pipeline.name))
    monkeypatch.setattr(nearbuckets, "RECORDS_PER_BUCKET", BAND_RECORDS)
    first = build_local(grown, tmp_path / "store")
    write_files(tmp_path, files, first=len(CHAINS))
    again = build_local(grown, tmp_path / "store")
    assert (again.stages["tokenize"].ran, again.stages["tokenize"].cached) == (1, len(CHAINS))
    assert (again.stages["near_buckets"].ran, again.stages["near_buckets"].cached) == (8, 0)
    assert (again.stages["near_clusters"].ran, again.stages["near_clusters"].cached) == (1, 0)
    fresh = build_local(grown, tmp_path / "fresh")
    assert fresh.snapshot.id == again.snapshot.id != first.snapshot.id
    assert fresh.stages["tokenize"].ran == len(CHAINS) + 1
    sizes = sizes_of(files)
    expected = chain_drops(chains, sum(sizes))
    assert len(expected) == 8 and drops_of(tmp_path / "store", again, sizes) == expected


EDGES_PER_RANGE = 8
"""Edge records a range of the cluster rounds holds in the crash tests: 16 ranges of the chain corpus."""


def test_the_cluster_rounds_give_one_drops_object_and_snapshot_whatever_the_ranges(
        chained: Chained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One range or many, the rounds end in the same clusters and the cluster stage merges the
    ranges' drops into the same bytes: the same snapshot id. With many ranges no round task
    holds more than a share of the edges (what bounds its memory)."""
    pipeline, files, chains = chained
    monkeypatch.setattr(nearbuckets, "RECORDS_PER_BUCKET", BAND_RECORDS)
    whole = build_local(pipeline, tmp_path / "one-range", 2)
    monkeypatch.setattr(nearrounds, "EDGES_PER_RANGE", EDGES_PER_RANGE)
    split = build_local(pipeline, tmp_path / "ranges", 2)
    assert split.snapshot.id == whole.snapshot.id
    ranges = split.stages["near_drops"].ran
    assert whole.stages["near_drops"].ran == 1 and ranges >= 8 and ranges & (ranges - 1) == 0
    assert split.stages["near_round"].ran >= 2 * ranges  # a large-star round at least, and the one that found stars
    held = [record["summary"]["held"] for record in committed_records(LocalStore(tmp_path / "ranges"), "near_round").values()]
    first = [record["summary"]["edges"] for record in committed_records(LocalStore(tmp_path / "ranges"), "near_route").values()]
    assert max(held) < sum(first) / 2
    sizes = sizes_of(files[:len(CHAINS)])
    assert drops_of(tmp_path / "ranges", split, sizes) == chain_drops(chains, sum(sizes))


def test_after_gc_a_build_runs_no_round_and_a_bad_drops_object_is_made_again_in_one_task(
        chained: Chained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gc collects the round tasks' records and objects (no snapshot names them). The next build
    finds the cluster task committed before any round and runs none; when the drops object has
    rotted too (and order tasks read it), the cluster task alone makes it again, every round in
    one process: the same bytes, the same snapshot."""
    pipeline, _, _ = chained
    store = tmp_path / "store"
    monkeypatch.setattr(nearbuckets, "RECORDS_PER_BUCKET", BAND_RECORDS)
    monkeypatch.setattr(nearrounds, "EDGES_PER_RANGE", EDGES_PER_RANGE)
    first = build_local(pipeline, store, 2)
    assert first.stages["near_round"].ran > 0
    run_prep("gc", "--store", store, "--grace", "0s")
    assert not committed_records(LocalStore(store), "near_round")
    again = build_local(pipeline, store, 2)
    assert again.snapshot.id == first.snapshot.id
    assert not {"near_route", "near_round", "near_drops"} & set(again.stages)
    [drops] = [record["outputs"]["drops"] for record in committed_records(LocalStore(store), "near_clusters").values()]
    flip_byte(object_path(store, drops), 200)
    forget_commits(store, "order")  # so the order tasks run and read the drops
    remade = build_local(pipeline, store, 2)
    assert remade.snapshot.id == first.snapshot.id and all_objects_intact(store)
    assert not {"near_route", "near_round", "near_drops"} & set(remade.stages)
    recomputed = [item["object"] for item in json.loads((store / remade.log_key).read_text())["recomputed"]]
    assert drops in recomputed


BUCKETS_DRIVER = """
import sys
from prep.runner import nearbuckets, nearrounds
nearbuckets.RECORDS_PER_BUCKET = int(sys.argv[1])
nearrounds.EDGES_PER_RANGE = int(sys.argv[2])
sys.argv = ["prep", *sys.argv[3:]]
from prep.cli.main import main
main()
"""


def build_in_buckets(pipeline: Path, store: Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`prep build --workers 2 --json` as the CLI runs it, with band buckets of BAND_RECORDS
    records and ranges of EDGES_PER_RANGE edges, in a session of its own (a crash point kills
    its whole process group)."""
    return subprocess.run([sys.executable, "-c", BUCKETS_DRIVER, str(BAND_RECORDS), str(EDGES_PER_RANGE), "build",
                           str(pipeline), "--store", str(store), "--workers", "2", "--json"], capture_output=True, text=True,
                          env=dict(env or prep_env()), timeout=300, start_new_session=True)


@pytest.fixture(scope="module")
def chained_snapshot(chained: Chained) -> str:
    """The snapshot id of an uninterrupted build of the chain corpus in band buckets (build_in_buckets)."""
    pipeline, _, _ = chained
    clean = build_in_buckets(pipeline, pipeline.parent / "clean")
    assert clean.returncode == 0, clean.stderr
    report = json.loads(clean.stdout)
    assert {stage["name"]: stage["ran"] for stage in report["stages"]}["near_buckets"] == 8
    return str(report["snapshot"])


def committed_bands(store: Path) -> set[str]:
    """The bands objects the store's committed tokenize task records name."""
    return {record["outputs"]["bands"] for record in committed_records(LocalStore(store), "tokenize").values()}


@pytest.mark.parametrize(("point", "reused"), [
    ("tokenize.after_output:1", {}),  # the signature stage: a part's bands made, not stored
    ("tokenize.before_commit:2", {"tokenize": 1}),  # the second part's bands stored, its task not committed
    ("near_buckets.after_write:1", {"tokenize": FILES}),
    ("near_buckets.before_commit:2", {"tokenize": FILES, "near_buckets": 1}),  # at the second band bucket
    ("near_route.after_write:3", {"tokenize": FILES, "near_buckets": 8}),
    ("near_round.before_commit:11", {"tokenize": FILES, "near_buckets": 8, "near_route": 8, "near_round": 10}),
    ("near_drops.after_write:3", {"tokenize": FILES, "near_buckets": 8, "near_route": 8}),
    ("near_clusters.after_write:1", {"tokenize": FILES, "near_buckets": 8}),
    ("near_clusters.before_commit:1", {"tokenize": FILES, "near_buckets": 8}),
])
def test_a_build_killed_in_the_near_stages_replays_to_the_same_snapshot(
        chained: Chained, chained_snapshot: str, tmp_path: Path,
        point: str, reused: dict[str, int]) -> None:
    """kill -9 in the signature (tokenize), bucket and cluster stages: nothing published, every
    stored object intact, and the rerun reuses what was committed and ends at the clean snapshot."""
    pipeline, _, _ = chained
    store = tmp_path / "store"
    crashed = build_in_buckets(pipeline, store, prep_env(PREP_CRASH_AT=point))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not (store / "refs").exists() and all_objects_intact(store)
    if point.startswith("tokenize.before_commit"):  # killed after a part's bands object was stored
        uncommitted = committed_bands(pipeline.parent / "clean") - committed_bands(store)
        assert any((store / object_key(parse_id(object_id))).exists() for object_id in uncommitted)
    rerun = build_in_buckets(pipeline, store)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert report["snapshot"] == chained_snapshot and all_objects_intact(store)
    cached = {stage["name"]: stage["cached"] for stage in report["stages"]}
    assert {name: cached[name] for name in reused} == reused
