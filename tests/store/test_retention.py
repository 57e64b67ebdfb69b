"""Retention on five real generations of tiny@latest: keep-last-3 keeps exactly the last three
readable and pullable and collects the rest, a held snapshot survives any gc until released,
DATASET@REF~N names the right generation, and the pipeline's [retention] reaches gc through the store."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from prep.errors import IntegrityError, NotFoundError, StoreError, UsageError
from prep.storage import LocalStore
from prep.store.gc import collect_garbage
from prep.store.holds import list_holds, place_hold, read_hold, release_hold
from prep.store.layout import history_key, retention_key
from prep.store.leases import GC, Lease
from prep.store.retention import Override, Policy, record_policy, snapshot_exists, stored_policy
from prep.store.snapshots import load_snapshot, resolve
from prep.transfer.pull import pull
from prep.transfer.verify import verify
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.store.test_gc import HOUR, age, reachable, stored_objects

GENERATIONS = 5


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, Path, list[str]]:
    """(store, pipeline, ids): five builds of tiny@latest, each editing one file; ids oldest first."""
    root = tmp_path_factory.mktemp("retention")
    for index in range(2):
        write_jsonl(root / "corpus" / f"part-{index}.jsonl", make_records(20, seed=index, prefix=f"p{index}"))
    pipeline = write_pipeline(root, tokenizer_path, shard_size="3KB", extra="\n[retention]\nkeep_last = 3\n")
    ids = []
    for generation in range(GENERATIONS):
        write_jsonl(root / "corpus" / "part-2.jsonl", make_records(15, seed=100 + generation, prefix="p2"))
        ids.append(run_prep("build", pipeline, "--store", root / "store", "--workers", "1").stdout.split()[-1])
    assert len(set(ids)) == GENERATIONS
    return root / "store", pipeline, ids


@pytest.fixture()
def store(history: tuple[Path, Path, list[str]], tmp_path: Path) -> LocalStore:
    shutil.copytree(history[0], tmp_path / "store", symlinks=True)
    return LocalStore(tmp_path / "store")


def assert_pullable(store: LocalStore, snapshot_id: str, dest: Path) -> None:
    """Pull the snapshot into `dest` and prove the copy is exactly its bytes."""
    snapshot = load_snapshot(store, snapshot_id)
    pull(store, snapshot, dest)
    assert verify(snapshot, dest).ok


def test_ancestry_names_each_generation(store: LocalStore, history: tuple[Path, Path, list[str]]) -> None:
    ids = history[2]
    for back in range(GENERATIONS):
        assert resolve(store, f"tiny@latest~{back}").id == ids[-1 - back]
    assert resolve(store, "tiny@latest~0").id == resolve(store, "tiny@latest").id
    with pytest.raises(NotFoundError, match="has taken only 5 generations, so ~4 is the oldest"):
        resolve(store, "tiny@latest~5")
    with pytest.raises(UsageError, match="a number of generations back"):
        resolve(store, "tiny@latest~two")
    with pytest.raises(NotFoundError, match="no ref tiny@nope"):
        resolve(store, "tiny@nope~1")
    store.delete(history_key("tiny", "latest", 2))
    with pytest.raises(NotFoundError, match="generation 2 of tiny@latest is not in the store's history"):
        resolve(store, "tiny@latest~3")


def test_keep_last_3_keeps_exactly_the_last_three_generations(store: LocalStore, tmp_path: Path,
                                                              history: tuple[Path, Path, list[str]]) -> None:
    ids = history[2]
    assert stored_policy(store, "tiny") == Policy(3, 0, "store"), "the build recorded the pipeline's [retention]"
    age(store.root, 2 * HOUR)
    dry = collect_garbage(store, HOUR, dry_run=True)
    assert {kept.by for kept in dry.rules if kept.rule == "keep_last"} == {f"tiny@latest~{n}" for n in range(3)}
    assert dry.policies["tiny"].source == "store"
    report = collect_garbage(store, HOUR)
    assert report.deleted["snapshots"].count == 2
    assert stored_objects(store) == set().union(*(reachable(store, i) for i in ids[-3:]))
    for back in range(3):
        assert snapshot_exists(store, ids[-1 - back])
        assert_pullable(store, resolve(store, f"tiny@latest~{back}").id, tmp_path / f"pulled-{back}")
    for back in (3, 4):
        assert not snapshot_exists(store, ids[-1 - back])
        with pytest.raises(NotFoundError, match=f"tiny@latest~{back} is snapshot .* no longer stored"):
            resolve(store, f"tiny@latest~{back}")
    from prep.store.fsck import fsck

    checked = fsck(store)
    assert checked.clean and checked.collected == 2, "collected generations are history, not damage"


def test_flags_override_the_recorded_policy(store: LocalStore, history: tuple[Path, Path, list[str]]) -> None:
    ids = history[2]
    age(store.root, 2 * HOUR)
    report = collect_garbage(store, HOUR, dry_run=True, policy=Override(1, 0))
    assert report.policies["tiny"].source == "flags" and report.deleted["snapshots"].count == 4
    partial = collect_garbage(store, HOUR, dry_run=True, policy=Override(keep_within=HOUR))
    assert partial.policies["tiny"] == Policy(3, HOUR, "flags"), "a flag left out keeps the recorded value"
    within = collect_garbage(store, HOUR, policy=Override(1, HOUR))
    assert within.deleted["snapshots"].count == 0, "every generation moved within the hour"
    assert {kept.snapshot for kept in within.rules if kept.rule == "keep_within"} >= set(ids)
    collect_garbage(store, HOUR, policy=Override(2, 0))
    assert [snapshot_exists(store, i) for i in ids] == [False, False, False, True, True]


def test_a_held_snapshot_survives_any_gc_until_released(store: LocalStore, tmp_path: Path,
                                                        history: tuple[Path, Path, list[str]]) -> None:
    oldest = history[2][0]  # no current ref names it
    hold, placed = place_hold(store, load_snapshot(store, oldest), "audit")
    assert placed and place_hold(store, load_snapshot(store, oldest), "again") == (read_hold(store, oldest), False)
    for _ in range(2):
        report = collect_garbage(store, 0, policy=Override(1, 0))
        assert [kept.by for kept in report.rules if kept.rule == "holds"] == ["hold: audit"]
        assert snapshot_exists(store, oldest) and not snapshot_exists(store, history[2][1])
        assert_pullable(store, oldest, tmp_path / "held")
        shutil.rmtree(tmp_path / "held")
    assert release_hold(store, oldest) == hold and list_holds(store) == []
    with pytest.raises(NotFoundError, match="is not held"):
        release_hold(store, oldest)
    collect_garbage(store, 0, policy=Override(1, 0))
    assert not snapshot_exists(store, oldest), "released, it is collectable again"


def test_a_hold_placed_while_gc_runs_withdraws(store: LocalStore, history: tuple[Path, Path, list[str]]) -> None:
    snapshot = load_snapshot(store, history[2][0])
    with Lease(store, GC), pytest.raises(StoreError, match="garbage collection is running"):
        place_hold(store, snapshot, "too late")
    assert list_holds(store) == [], "nothing held: a gc that listed holds before it would not have seen it"


def test_policies_are_recorded_once_per_change_and_an_unreadable_one_stops_gc(store: LocalStore) -> None:
    def keys() -> list[str]:
        return [info.key for info in store.list("retention/tiny/")]

    assert keys() == [retention_key("tiny", 1)], "five builds with one policy recorded it once"
    record_policy(store, "tiny", Policy(7, 60))
    record_policy(store, "tiny", Policy(7, 60))
    assert keys() == [retention_key("tiny", 1), retention_key("tiny", 2)]
    assert stored_policy(store, "tiny") == Policy(7, 60, "store")
    store.put_bytes(retention_key("tiny", 3), b'{"schema": "prep.retention/1", "keep_last": "many"}')
    before = sorted(info.key for info in store.list(""))
    with pytest.raises(IntegrityError, match="unreadable retention policy"):
        collect_garbage(store, 0)
    assert sorted(info.key for info in store.list("")) == before, "gc deleted nothing it could not judge"


def test_two_holds_at_once_place_one(store: LocalStore, history: tuple[Path, Path, list[str]]) -> None:
    snapshot = load_snapshot(store, history[2][0])
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda reason: place_hold(store, snapshot, reason), ["first", "second"]))
    assert sorted(placed for _, placed in results) == [False, True], "create-only: exactly one writer wins"
    winner = next(hold for hold, placed in results if placed)
    assert [hold.reason for hold, _ in results] == [winner.reason] * 2 and list_holds(store) == [winner]


def test_a_deleted_tag_keeps_only_what_its_earlier_generations_are_kept_for(
        store: LocalStore, history: tuple[Path, Path, list[str]]) -> None:
    from prep.store.refs import move_ref
    from prep.store.tags import delete_tag

    oldest = history[2][0]
    move_ref(store, "tiny", "golden", oldest)
    delete_tag(store, "tiny", "golden")  # generation 2: a tombstone still naming `oldest`
    report = collect_garbage(store, 0, dry_run=True, policy=Override(2, 0))
    assert [kept.by for kept in report.rules if kept.snapshot == oldest] == ["tiny@golden~1"]
    collect_garbage(store, 0, policy=Override(1, 0))
    assert not snapshot_exists(store, oldest), "a tombstone keeps nothing: the tag no longer names it"
