"""Task record packs: a pack reads back as the records it was written from, and one that fails
any check (a flipped byte, a truncation, a record under another key or of another stage) is
ignored whole and reported (its tasks are not committed by it); a plan finds its own packs and a
plan that differs by a few keys (even its smallest) the packs of the one before, in a few
requests; single records are found by listing, not a request a key."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.manifest import canonical
from prep.storage import LocalStore
from prep.storage.backend import ObjectInfo
from prep.store import packs, records
from prep.store.layout import PACKS_PREFIX, pack_key
from tests.runner.buildsupport import RequestCountingStore

STAGE = "toy"


def key_of(index: int) -> str:
    return hashlib.sha256(f"task {index}".encode()).hexdigest()


def commit(store: LocalStore, keys: list[str], stage: str = STAGE) -> list[records.TaskRecord]:
    """Commit a record for each key (its output named after the key), as a build does."""
    return [records.write_task_record(store, stage, key, {"out": f"sha256:{key}"}, {"n": index})
            for index, key in enumerate(keys)]


def find(store: LocalStore, keys: list[str], pack_records: int = 1000) -> tuple[dict[str, records.TaskRecord | None],
                                                                              list[str]]:
    warned: list[str] = []
    return packs.find_committed(store, STAGE, keys, 8, pack_records, warned.append), warned


def pack_keys(store: LocalStore) -> list[str]:
    return sorted(info.key for info in store.list(PACKS_PREFIX))


def test_a_plan_is_named_by_its_keys_in_any_order_and_anchored_by_its_smallest() -> None:
    keys = [key_of(index) for index in range(10)]
    plan = packs.Plan.of(STAGE, keys)
    assert plan == packs.Plan.of(STAGE, keys[::-1]) and plan.anchors == tuple(sorted(keys)[:2])
    assert packs.Plan.of(STAGE, keys[1:]).plan != plan.plan
    assert packs.Plan.of(STAGE, ["not hex"]).anchors == ()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=20, unique=True), st.data())
def test_a_pack_reads_back_as_written_and_any_flipped_byte_is_refused(indexes: list[int], data: st.DataObject) -> None:
    keys = [key_of(index) for index in indexes]
    batch = [records.TaskRecord(STAGE, key, {"out": f"sha256:{key}"}, {"n": n}) for n, key in enumerate(keys)]
    plan = packs.Plan.of(STAGE, keys)
    raw = packs.pack_bytes(plan, batch)
    key = pack_key(STAGE, plan.anchors[0], plan.plan, hashlib.sha256(raw).hexdigest())
    assert packs.parse_pack(key, raw, "pack") == {record.key: record for record in batch}
    at = data.draw(st.integers(0, len(raw) - 1))
    flipped = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]
    with pytest.raises(IntegrityError, match="does not hash to its name"):
        packs.parse_pack(key, flipped, "pack")
    with pytest.raises(IntegrityError, match="does not hash to its name"):
        packs.parse_pack(key, raw[:at], "pack")


def test_a_rerun_of_a_plan_reads_its_packs_not_a_record_a_task(tmp_path: Path) -> None:
    store = RequestCountingStore(tmp_path / "store")
    keys = [key_of(index) for index in range(2000)]
    written = commit(store, keys)
    first, _ = find(store, keys)  # nothing packed yet: each record looked up, then packed
    assert first == dict(zip(keys, written)) and len(pack_keys(store)) == 2
    before = dict(store.requests)
    again, warned = find(store, keys)
    assert again == first and not warned
    used = {kind: store.requests[kind] - before[kind] for kind in before}
    assert used == {"put": 0, "get": 2, "head": 0, "list": 2}, used


def test_a_plan_with_an_appended_key_reads_the_packs_of_the_plan_before(tmp_path: Path) -> None:
    store = RequestCountingStore(tmp_path / "store")
    keys = [key_of(index) for index in range(300)]
    commit(store, keys)
    find(store, keys)
    smallest = "0" * 64  # a new task whose key sorts first: the old plan's anchor is the new one's second
    for appended in ([key_of(300)], [smallest]):
        before = store.requests["get"]
        found, _ = find(store, keys + appended)
        assert all(found[key] is not None for key in keys) and found[appended[0]] is None
        assert store.requests["get"] - before == 1 + 1, "one pack of the plan before, one GET for the new key"


def test_a_plan_whose_old_anchor_was_replaced_finds_the_packs_of_the_plan_before(tmp_path: Path) -> None:
    """Regression: with records only in packs (grouped commits), an edit that replaced the old
    plan's smallest key left the new plan no shared anchor, so every task would have run again.
    The lookup then reads the stage's newest other plan: the unchanged tasks are found, packed
    under the new plan, and a second lookup reads its own packs only."""
    store = RequestCountingStore(tmp_path / "store")
    keys = sorted(key_of(index) for index in range(300))
    batch = [records.TaskRecord(STAGE, key, {"out": f"sha256:{key}"}, {"n": n}) for n, key in enumerate(keys)]
    packs.write_pack(store, packs.Plan.of(STAGE, keys), batch)
    edited = [*keys[1:], "f" * 64]  # the smallest key's task changed; its new key sorts last
    found, _ = find(store, edited)
    assert all(found[key] == record for key, record in zip(keys[1:], batch[1:])) and found["f" * 64] is None
    before = store.requests["get"]
    again, _ = find(store, edited)
    assert again == found and store.requests["get"] - before == 2, "its own pack and the one missing key"


def _two_plans(store: LocalStore) -> tuple[list[str], list[str]]:
    """Packs of two plans of the stage, the second newer (as a merge's two levels leave them)."""
    first, second = sorted(key_of(index) for index in range(30)), sorted(key_of(index) for index in range(30, 40))
    for keys in (first, second):
        batch = [records.TaskRecord(STAGE, key, {"out": f"sha256:{key}"}, {"n": n}) for n, key in enumerate(keys)]
        packs.write_pack(store, packs.Plan.of(STAGE, keys), batch)
        time.sleep(0.01)
    return first, second


def test_a_plan_whose_anchor_was_replaced_finds_its_records_past_a_newer_plan_of_the_same_stage(tmp_path: Path) -> None:
    """Regression (CI on f70e175, test_merging flaky): a stage with two plans a build (the merge
    levels), the edit replacing the first level's anchor; the lookup read only the stage's newest
    plan, the second level's, and every merge ran again. It now reads on past a plan that answers nothing."""
    store = RequestCountingStore(tmp_path / "store")
    first, _ = _two_plans(store)
    edited = [*first[1:], "f" * 64]
    before = store.requests["get"]
    found, _ = find(store, edited)
    assert all(found[key] is not None for key in first[1:]) and found["f" * 64] is None
    assert store.requests["get"] - before == 2 + 1, "the newer plan's pack, the older one's, the new key"


DAMAGES = ("flipped byte", "truncated", "record under another key", "record of another stage")


def corrupt(store: LocalStore, key: str, damage: str) -> None:
    """Damage the pack at `key` as `damage` says; a crafted pack is stored under its true hash."""
    path = store.local_path(key)
    assert path is not None
    path.chmod(0o644)
    raw = path.read_bytes()
    if damage in ("flipped byte", "truncated"):
        path.write_bytes(raw[:40] + bytes([raw[40] ^ 1]) + raw[41:] if damage == "flipped byte" else raw[:len(raw) // 2])
        return
    body = canonical.loads(raw)
    victim = min(body["records"])
    if damage == "record under another key":
        body["records"][victim]["key"] = hashlib.sha256(victim.encode()).hexdigest()
    else:
        body["records"][victim]["stage"] = "other"
    crafted = canonical.dumps(body)
    path.unlink()
    stage, anchor = key.split("/")[1:3]
    store.put_bytes(pack_key(stage, anchor, body["plan"], hashlib.sha256(crafted).hexdigest()), crafted)


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_pack_is_ignored_whole_and_reported(tmp_path: Path, damage: str) -> None:
    store = LocalStore(tmp_path / "store")
    keys = [key_of(index) for index in range(50)]
    written = dict(zip(keys, commit(store, keys)))
    find(store, keys)
    [packed] = pack_keys(store)
    corrupt(store, packed, damage)
    found, warned = find(store, keys)
    assert found == written, "every record from its own key, none from the damaged pack"
    assert len(warned) == 1 and "unusable task pack is ignored" in warned[0], warned
    assert {"flipped byte": "hash", "truncated": "hash", "record under another key": "holds the record of task",
            "record of another stage": "holds the record of task"}[damage] in warned[0]


def record_of(index: int, output: str = "a") -> records.TaskRecord:
    return records.TaskRecord(STAGE, key_of(index), {"output": "sha256:" + output * 64}, {})


def held_by(**named: tuple[ObjectInfo, list[int]]) -> list[tuple[ObjectInfo, dict[str, records.TaskRecord]]]:
    return [(info, {record_of(i).key: record_of(i) for i in indexes}) for info, indexes in named.values()]


def test_only_the_newest_plan_of_a_folder_outlives_the_grace_period() -> None:
    anchor, plans = key_of(0), [key_of(1), key_of(2)]
    old, new, other = (pack_key(STAGE, anchor, plans[0], "a" * 64), pack_key(STAGE, anchor, plans[1], "b" * 64),
                       pack_key(STAGE, key_of(3), plans[0], "c" * 64))
    infos = held_by(old=(ObjectInfo(old, 1, 10.0), [0, 1]), new=(ObjectInfo(new, 1, 20.0), [0, 1, 2]),
                    other=(ObjectInfo(other, 1, 5.0), [3]), stray=(ObjectInfo("packs/x", 1, 1.0), []))
    assert packs.superseded(infos, cutoff=30.0) == {old}, "the newest plan of each folder stays, whatever its age"
    assert packs.superseded(infos, cutoff=5.0) == set(), "nothing younger than the grace period goes"
    resumed = held_by(resumed=(ObjectInfo(pack_key(STAGE, anchor, plans[0], "d" * 64), 1, 40.0), [0, 1, 2]))
    assert packs.superseded([*infos, *resumed], cutoff=30.0) == {new}, \
        "no pack of a plan with a pack younger than the grace period goes (a build of it may resume)"
    later = held_by(later=(ObjectInfo(pack_key(STAGE, anchor, key_of(4), "e" * 64), 1, 50.0), [0, 1, 2]))
    assert packs.superseded([*infos, *resumed, *later], cutoff=30.0) == {new}, "the old plan stays while it is young"


def test_an_old_plan_stays_while_the_newest_plan_lacks_any_of_its_records() -> None:
    """A newer version that changed a part packs the unchanged parts' records only: the kept old
    version's packs must stay, or a rebuild of it runs its changed parts again (CI on 9b93a53: two
    packs of equal age, the one holding only unchanged parts superseded the kept build's)."""
    anchor = key_of(0)
    old, new = pack_key(STAGE, anchor, key_of(1), "a" * 64), pack_key(STAGE, anchor, key_of(2), "b" * 64)
    unchanged = held_by(old=(ObjectInfo(old, 1, 10.0), [0, 1, 2]), new=(ObjectInfo(new, 1, 20.0), [0, 1]))
    assert packs.superseded(unchanged, cutoff=30.0) == set(), "the old plan's record of part 2 is nowhere else"
    other = [(ObjectInfo(new, 1, 20.0), {**unchanged[1][1], key_of(2): record_of(2, "b")})]
    assert packs.superseded([unchanged[0], *other], cutoff=30.0) == set(), "nor is one naming other outputs"
    split = pack_key(STAGE, anchor, key_of(2), "c" * 64)
    rest = held_by(rest=(ObjectInfo(split, 1, 15.0), [2]))
    assert packs.superseded([*unchanged, *rest], cutoff=30.0) == {old}, "the newest plan's packs together hold it all"


def test_a_pack_holds_only_what_it_is_given_and_nothing_when_nothing_is_committed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    keys = [key_of(index) for index in range(5)]
    found, _ = find(store, keys)
    assert found == dict.fromkeys(keys) and pack_keys(store) == [], "nothing committed: nothing packed"
    batch = commit(store, keys[:2], stage="other")
    with pytest.raises(IntegrityError, match="records of another stage"):
        packs.write_pack(store, packs.Plan.of(STAGE, keys), batch)
