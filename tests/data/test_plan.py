"""prep.data.plan and the cache's eviction on fixed plans: the plan's next uses are exact, and on a
plan that rereads, Belady fetches what the optimal offline policy fetches and fewer bytes than LRU."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from prep.data.nodecache import KEEP_STEPS, CacheOptions, NodeCache
from prep.data.plan import Need, Plan
from prep.data.prefetch import Prefetcher
from prep.storage import LocalStore
from prep.store import cas

SIZE = 1000


def objects(store: LocalStore, tmp_path: Path, count: int) -> list[Need]:
    needs = []
    for index in range(count):
        local = tmp_path / f"object-{index}"
        local.write_bytes(bytes([index]) * SIZE)
        digest = cas.put_file(store, local)
        needs.append(Need(digest.sha256, digest.size, f"object {index}"))
    return needs


def steps_of(order: list[list[int]], needs: list[Need]) -> Callable[[int, int], list[list[Need]]]:
    """A plan's input for a fixed order: step s reads needs[i] for each i in order[s]."""
    return lambda step, count: [[needs[i] for i in order[s]] for s in range(step, min(step + count, len(order)))]


def optimal_fetches(order: list[int], capacity: int) -> int:
    """Belady's MIN over the whole sequence, written independently of the cache."""
    held: set[int] = set()
    fetches = 0
    for at, item in enumerate(order):
        if item in held:
            continue
        fetches += 1
        if len(held) == capacity:
            future = order[at + 1:]
            held.remove(max(held, key=lambda h: future.index(h) if h in future else len(future)))
        held.add(item)
    return fetches


def lru_fetches(order: list[int], capacity: int) -> int:
    recent: list[int] = []
    fetches = 0
    for item in order:
        if item in recent:
            recent.remove(item)
        else:
            fetches += 1
            if len(recent) == capacity:
                recent.pop(0)
        recent.append(item)
    return fetches


def test_plan_next_use_and_upcoming_follow_the_steps() -> None:
    needs = [Need(f"{i:064x}", 10, f"n{i}") for i in range(4)]
    order = [[0, 1], [2], [0], [3], [1]]
    plan = Plan(steps_of(order, needs), horizon=3)
    plan.advance(0)
    assert [plan.next_use(n.sha256) for n in needs] == [0, 0, 1, None]  # 3 is past the horizon
    assert [n.what for n in plan.upcoming(2, None)] == ["n0", "n1", "n2"]
    assert [n.what for n in plan.upcoming(None, 20)] == ["n0", "n1"]
    plan.advance(1)
    assert [plan.next_use(n.sha256) for n in needs] == [2, None, 1, 3]
    plan.advance(4)
    assert [plan.next_use(n.sha256) for n in needs] == [None, 4, None, None]
    plan.advance(2)  # backwards: rebuilt from there
    assert plan.next_use(needs[0].sha256) == 2 and plan.next_use(needs[1].sha256) == 4


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4] * 6, [0, 1, 2, 0, 3, 0, 4, 1, 2, 0, 1, 3, 4, 2, 0] * 2])
def test_belady_matches_the_optimum_and_beats_lru_on_a_rereading_plan(tmp_path: Path, order: list[int]) -> None:
    store = LocalStore(tmp_path / "store")
    needs = objects(store, tmp_path, 5)
    fetched = {}
    for policy in ("belady", "lru"):
        cache = NodeCache(store, CacheOptions(tmp_path / policy, 3 * SIZE, policy=policy))
        plan = cache.plan = Plan(steps_of([[i] for i in order], needs), horizon=len(order))
        for step, item in enumerate(order):
            plan.advance(step)
            with cache.using(needs[item]) as hold:
                assert hold.file.read() == hold.path.read_bytes() == bytes([item]) * SIZE
        fetched[policy] = cache.stats.bytes_fetched
        assert cache.stats.peak_bytes <= 3 * SIZE
        cache.close()
    assert fetched["belady"] == optimal_fetches(order, 3) * SIZE
    assert fetched["lru"] == lru_fetches(order, 3) * SIZE
    assert fetched["belady"] < fetched["lru"]


def test_a_prefetch_never_evicts_a_file_needed_sooner(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    needs = objects(store, tmp_path, 3)
    order = [0, 1, 2, 0, 1]
    cache = NodeCache(store, CacheOptions(tmp_path / "cache", 2 * SIZE))
    cache.plan = Plan(steps_of([[i] for i in order], needs), horizon=len(order))
    cache.plan.advance(0)
    for need in needs[:2]:
        with cache.using(need):
            pass
    cache.plan.advance(2)  # now 2 is needed now, 0 next, 1 after it
    cache.prefetch(needs[1])  # already there: nothing to do
    assert cache.stats.fetches == 2
    cache.plan.advance(3)  # 0 now, 1 next, 2 never: prefetching 2 must not evict either
    cache.prefetch(needs[2])
    assert cache.stats.fetches == 2 and not cache.path_of(needs[2].sha256).exists()
    cache.close()


def test_a_step_reading_one_object_twice_counts_it_once() -> None:
    """Two sources of a mixture sharing a shard list its object twice in one step."""
    needs = [Need(f"{i:064x}", 10, f"n{i}") for i in range(2)]
    plan = Plan(steps_of([[0, 0], [1], [0]], needs), horizon=3)
    plan.advance(0)
    plan.advance(1)  # used to pop two uses of object 0, losing its use at step 2
    assert plan.next_use(needs[0].sha256) == 2 and plan.objects(1) == {needs[1].sha256}


def read_step(cache: NodeCache, plan: Plan, step: int, needs: list[Need]) -> None:
    """What a reader does for one step: pin and release its objects, then advance and settle."""
    for need in needs:
        cache.release(cache.acquire(need))
    plan.advance(step + 1)
    cache.settle(plan.objects(step + 1))


def test_idle_pins_stay_while_a_coming_step_reads_the_file_and_block_another_users_eviction(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    needs = objects(store, tmp_path, 3)
    calm = KEEP_STEPS + 1
    order = [[0, 1]] * calm + [[2], [0]] + [[2]] * 20 + [[1]]  # then 0 is read again in 2 steps, 1 in 23
    mine = NodeCache(store, CacheOptions(tmp_path / "cache", 3 * SIZE))
    other = NodeCache(store, CacheOptions(tmp_path / "cache", 3 * SIZE))
    mine.plan = plan = Plan(steps_of(order, needs), horizon=len(order))
    plan.advance(0)
    for step in range(calm - 1):
        read_step(mine, plan, step, needs[:2])
    holds = mine.pin_held(needs[:2])
    assert holds is not None and mine.pin_held(needs) is None  # all or none
    with mine.dir.locked():
        assert not mine._evict(needs[0].sha256)  # in use by this very step
    mine.release(*holds)
    read_step(mine, plan, calm - 1, [])
    assert set(mine._holds) == {needs[0].sha256}
    with other.dir.locked():
        assert not other.dir.try_evict(needs[0].sha256)  # pinned by `mine` for step calm + 1
        assert other.dir.try_evict(needs[1].sha256)  # not read within KEEP_STEPS: unpinned, evictable
    other.dir.signal_pressure()  # another user waits for room: idle pins go at the next step
    read_step(mine, plan, calm, needs[2:])
    assert set(mine._holds) == set() and mine._calm == 0
    with other.dir.locked():
        assert other.dir.try_evict(needs[0].sha256)
    mine.close()
    other.close()


def test_until_the_cache_is_calm_idle_pins_stay_only_for_the_next_step(tmp_path: Path) -> None:
    """A cache that evicts (or hears of pressure) keeps pinned only what the next step reads, so the other
    users of a thrashing cache are not kept from evicting what this one reads several steps on."""
    store = LocalStore(tmp_path / "store")
    needs = objects(store, tmp_path, 3)
    cache = NodeCache(store, CacheOptions(tmp_path / "cache", 2 * SIZE))
    cache.plan = plan = Plan(steps_of([[0], [1], [0]] * 3 * KEEP_STEPS, needs), horizon=4 * KEEP_STEPS)
    plan.advance(0)
    read_step(cache, plan, 0, needs[:1])  # fresh: 0 is read again in 2 steps, but not in the next one
    assert set(cache._holds) == set()
    read_step(cache, plan, 1, needs[1:2])
    read_step(cache, plan, 2, needs[2:3])  # 2 did not fit: an eviction, so the count starts again
    assert cache.stats.evictions == 1 and cache._calm == 0
    cache.close()


def test_prefetch_asks_for_no_more_coming_objects_than_the_cache_holds(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path / "store")
    needs = objects(store, tmp_path, 4)
    cache = NodeCache(store, CacheOptions(tmp_path / "cache", 2 * SIZE + SIZE // 2))
    cache.plan = plan = Plan(steps_of([[0], [1], [2], [3]], needs), horizon=4)
    asked: list[Need] = []
    monkeypatch.setattr(cache, "prefetch", asked.append)
    prefetcher = Prefetcher(cache, plan, None, None, jobs=1)
    plan.advance(0)
    prefetcher.kick()
    deadline = time.monotonic() + 10
    while prefetcher._queued and time.monotonic() < deadline:
        time.sleep(0.01)
    assert asked == needs[:2]  # the third could only stay by evicting one needed sooner
    prefetcher.close()
    cache.close()
