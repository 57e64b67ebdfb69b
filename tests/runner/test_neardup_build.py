"""Near-duplicate removal wired into the build (issue 42): planted near duplicates are removed,
the first of each cluster kept, verify joins no dissimilar documents, and the snapshot id is the
same on any worker count; bad settings stop the build before any task."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.storage.local import LocalStore
from prep.store import cas
from prep.store.localcopy import local_file
from prep.workfiles.drops import open_drops
from tests.helpers import prep_env, run_prep, write_jsonl, write_pipeline
from tests.neardup.neardupsupport import document, edited, true_jaccard
from tests.runner.buildsupport import InProcessExecutor, all_objects_intact, build_local

FILES = 3
NEAR = '\n[dedup.near]\nthreshold = 0.7\nngram = 5\npermutations = 128\nbands = 32\nrows = 4\nverify = true\n'



def planted(rng: random.Random) -> list[list[str]]:
    """Unrelated documents and originals each followed by copies edited at 0 to 12% of words, in input order."""
    docs = [document(rng, rng.randint(40, 120)) for _ in range(60)]
    for _ in range(40):
        words = document(rng, rng.randint(80, 200))
        docs.append(words)
        docs.extend(edited(rng, words, rng.choice([0.0, 0.01, 0.03, 0.08, 0.12])) for _ in range(rng.randint(1, 2)))
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, list[list[str]]]:
    root = tmp_path_factory.mktemp("near")
    docs = planted(random.Random(11))
    bounds = [len(docs) * index // FILES for index in range(FILES + 1)]
    for index in range(FILES):
        write_jsonl(root / "corpus" / f"part-{index}.jsonl",
                    [{"id": f"d{at}", "text": " ".join(docs[at])} for at in range(bounds[index], bounds[index + 1])])
    write_pipeline(root, tokenizer_path, shard_size="8KB", extra=NEAR)
    return root, docs


def drops_of(store: Path, result: BuildResult, sizes: list[int]) -> dict[int, int]:
    """The snapshot's near-duplicate drops as corpus positions: dropped -> kept representative."""
    stage = next(run for run in result.snapshot.manifest["stages"] if run["name"] == "near_clusters")
    drops_id = json.loads(cas.get_bytes(LocalStore(store), stage["output"]))["drops"]
    records = open_drops(local_file(LocalStore(store), drops_id)).read_all()
    starts = np.concatenate([[0], np.cumsum(sizes)])

    def position(number: Any) -> int:
        return int(starts[int(number) >> 32] + (int(number) & 0xFFFFFFFF))

    return {position(d): position(r) for d, r in zip(records["document"], records["representative"])}


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


@pytest.mark.parametrize("point", ["near_buckets.before_commit:1", "near_buckets.after_write:1",
                                   "near_clusters.before_commit:1"])
def test_a_build_killed_in_the_near_stages_replays_to_the_same_snapshot(corpus: tuple[Path, list[list[str]]],
                                                                       tmp_path: Path, point: str) -> None:
    root, _ = corpus
    pipeline = root / "pipeline.toml"
    clean = run_prep("build", pipeline, "--store", tmp_path / "clean", "--workers", "2").stdout.split()[-1]
    crashed = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "2", check=False,
                       env=prep_env(PREP_CRASH_AT=point), new_session=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert all_objects_intact(tmp_path / "store")
    assert run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "2").stdout.split()[-1] == clean
