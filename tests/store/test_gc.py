"""Garbage collection: after builds killed mid-way, gc keeps every ref'd snapshot complete and
verifiable, removes the rest once past the grace period, and stays out of running builds' way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prep import hashing
from prep.errors import IntegrityError, StoreError, UsageError
from prep.history.lineage import trace
from prep.manifest import canonical
from prep.storage import LocalStore, open_store
from prep.storage.backend import Store
from prep.store import cas, records
from prep.store.fsck import fsck
from prep.store.gc import collect_garbage, parse_duration
from prep.store.layout import PACKS_PREFIX, lease_key, pack_key, stage_record_key, task_record_key
from prep.store.leases import BUILD, GC, Lease, build_lease, process_scope, read_leases
from prep.store.refs import move_ref
from prep.store.snapshots import Snapshot, load_snapshot, publish_manifest, resolve
from tests.helpers import make_records, prep_env, run_prep, user_package, write_jsonl, write_pipeline
from tests.runner.test_disk_full import fill_up, small_tmpfs
from tests.runner.test_rebuild import HELPERS, RULES
from tests.store.layout1 import plant_layout1
from tests.store.layout2 import plant_layout2

HOUR = 3600
EMPTY_TOKENIZE = {"documents": 0, "tokens": 0, "text_bytes": 0, "bad_records": 0, "special_token_documents": 0,
                  "lines": 0, "bad_record_examples": []}


def age(root: Path, seconds: float) -> None:
    """Make every file and folder of a local store look `seconds` old."""
    moment = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        os.utime(path, (moment, moment), follow_symlinks=False)


def reachable(store: Store, snapshot_id: str) -> set[str]:
    """Every object a snapshot needs, enumerated from the stage manifests' structure."""
    snapshot = load_snapshot(store, snapshot_id)
    found = {hashing.parse_id(snapshot.id)} | {a["sha256"] for a in snapshot.artifacts}
    if "object" in snapshot.manifest["tokenizer"]:  # the tokenizer file, carried since issue 43
        found.add(hashing.parse_id(snapshot.manifest["tokenizer"]["object"]))
    found |= {hashing.parse_id(entry["object"]) for entry in snapshot.manifest.get("step_sources", ())}  # and step code
    for stage in snapshot.manifest["stages"]:
        found.add(hashing.parse_id(stage["output"]))
        body: dict[str, Any] = canonical.loads(cas.get_bytes(store, stage["output"]))
        named = {"tokenize": lambda b: [oid for t in b["tasks"]  # step outcomes: a pipeline with [[steps]]
                                        for oid in (t["output"], t.get("entries"), *t.get("step_outcomes", ())) if oid],
                 "dedup": lambda b: [b["outputs"]["keep"]],  # layout 1
                 "shuffle": lambda b: [b["outputs"]["plan"]],  # layout 1
                 "route": lambda b: [t["output"] for t in b["tasks"]],  # layout 2
                 "order": lambda b: [bucket["output"] for bucket in b["buckets"]],  # layouts 2 and 3
                 "shard": lambda b: [o for s in b["shards"] for o in s["outputs"].values()]}[stage["name"]](body)
        named += [body["parts_table"]] if "parts_table" in body else []  # order and shard, since issue 40
        found |= {hashing.parse_id(object_id) for object_id in named}
    return found


def stored_objects(store: Store) -> set[str]:
    return {info.key.rsplit("/", 1)[-1] for info in store.list(cas.OBJECTS_PREFIX)}


def assert_records_resolve(store: Store) -> None:
    """No commit record (nor a pack of task records) may name an object that is gone."""
    present = stored_objects(store)
    for info in [*store.list(records.TASKS_PREFIX), *store.list(records.STAGES_PREFIX), *store.list(PACKS_PREFIX)]:
        body = store.get_bytes(info.key).decode()
        for object_id in body.split('"'):
            if object_id.startswith("sha256:"):
                assert hashing.parse_id(object_id) in present, f"{info.key} names missing {object_id}"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    """Pipelines v1 and v2 (v2 edits one file and adds one) and a store holding v1 as tiny@latest."""
    root = tmp_path_factory.mktemp("gc")
    for version in ("v1", "v2"):
        for index in range(3):
            write_jsonl(root / version / "corpus" / f"part-{index}.jsonl",
                        make_records(25, seed=index + (10 if version == "v2" and index == 2 else 0), prefix=f"p{index}"))
    write_jsonl(root / "v2" / "corpus" / "part-3.jsonl", make_records(20, seed=30, prefix="p3"))
    paths = {version: write_pipeline(root / version, tokenizer_path, shard_size="3KB") for version in ("v1", "v2")}
    paths["store"] = root / "store"
    run_prep("build", paths["v1"], "--store", paths["store"], "--workers", "1")
    return paths


@pytest.fixture()
def project(template: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """The template with a private copy of its store."""
    shutil.copytree(template["store"], tmp_path / "store", symlinks=True)
    return {**template, "store": tmp_path / "store"}


def crash(pipeline: Path, store: Path | str, point: str) -> None:
    result = run_prep("build", pipeline, "--store", store, "--workers", "1", check=False,
                      env=prep_env(PREP_CRASH_AT=point), new_session=True)
    assert result.returncode == -signal.SIGKILL, result.stderr


def test_gc_after_interrupted_builds_keeps_refs_complete_and_frees_the_rest(project: dict[str, Path]) -> None:
    store = LocalStore(project["store"])
    kept = resolve(store, "tiny@latest")
    crash(project["v2"], project["store"], "shard.before_commit")
    crash(project["v2"], project["store"], "shard.after_write")  # leaves files in the store's tmp/
    orphans = stored_objects(store) - reachable(store, kept.id)
    assert orphans, "the killed build should have left objects behind"

    fresh = collect_garbage(store, grace_seconds=HOUR)
    assert fresh.freed.count == 0, "nothing is older than the grace period yet"
    age(project["store"], 2 * HOUR)
    before = sorted(info.key for info in store.list(""))
    dry = collect_garbage(store, grace_seconds=HOUR, dry_run=True)
    assert sorted(info.key for info in store.list("")) == before, "a dry run deletes nothing"
    report = collect_garbage(store, grace_seconds=HOUR)
    assert report.deleted == dry.deleted
    assert report.deleted["objects"].count == len(orphans)
    assert report.deleted["records"].count > 0 and report.deleted["temporary"].count > 0

    assert stored_objects(store) == reachable(store, kept.id)
    assert all(cas.check(store, f"sha256:{a['sha256']}") for a in kept.artifacts)
    assert_records_resolve(store)
    assert list((project["store"] / "tmp").iterdir()) == []
    assert [info.key for info in store.list("snapshots/")] == [f"snapshots/{hashing.parse_id(kept.id)}"]
    assert trace(store, kept, "p0-3")[0].placements, "stage records of the ref'd snapshot still serve lineage"

    # The crashed build's work is gone, not half-there: rebuilding v2 completes and verifies.
    rebuilt = run_prep("build", project["v2"], "--store", project["store"], "--workers", "1").stdout.split()[-1]
    assert all(cas.check(store, f"sha256:{a['sha256']}") for a in load_snapshot(store, rebuilt).artifacts)
    assert run_prep("build", project["v1"], "--store", project["store"]).stdout.split()[-1] == kept.id


def test_gc_keeps_every_current_ref_and_drops_what_none_reaches(project: dict[str, Path]) -> None:
    store = LocalStore(project["store"])
    first = resolve(store, "tiny@latest")
    run_prep("build", project["v2"], "--store", project["store"], "--workers", "1", "--tag", "candidate")
    second = resolve(store, "tiny@latest")
    move_ref(store, "tiny", "golden", first.id)
    age(project["store"], 2 * HOUR)
    collect_garbage(store, grace_seconds=HOUR)
    assert stored_objects(store) == reachable(store, first.id) | reachable(store, second.id)

    move_ref(store, "tiny", "golden", second.id)  # now nothing current names the first snapshot
    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)
    assert stored_objects(store) == reachable(store, second.id)
    assert report.deleted["snapshots"].count == 1
    assert_records_resolve(store)
    log = run_prep("log", "tiny", "--store", project["store"]).stdout
    assert first.id in log, "history still records the collected snapshot"


def test_a_collected_snapshot_takes_its_read_back_record_with_it(project: dict[str, Path]) -> None:
    """Else a rebuild storing the manifest object again would be trusted on a proof of deleted bytes."""
    store = LocalStore(project["store"])
    first = resolve(store, "tiny@latest")
    assert records.read_readback(store, first.id) is not None, "the build read its snapshot back"
    run_prep("build", project["v2"], "--store", project["store"], "--workers", "1")
    second = resolve(store, "tiny@latest")
    age(project["store"], 2 * HOUR)
    collect_garbage(store, grace_seconds=HOUR)
    assert records.read_readback(store, first.id) is None
    assert records.read_readback(store, second.id) is not None, "a kept snapshot keeps its record"


def test_collected_objects_leave_the_proven_record(project: dict[str, Path]) -> None:
    """The record of proven files names only objects the store still holds."""
    from prep.store import proven

    store = LocalStore(project["store"])
    first = resolve(store, "tiny@latest")
    run_prep("build", project["v2"], "--store", project["store"], "--workers", "1")
    second = resolve(store, "tiny@latest")
    gone = {f"sha256:{sha}" for sha in reachable(store, first.id) - reachable(store, second.id)}
    assert gone & set(proven.load(store)), "the first build proved files the second does not name"
    age(project["store"], 2 * HOUR)
    collect_garbage(store, grace_seconds=HOUR)
    named = set(proven.load(store))
    assert named and named <= {f"sha256:{sha}" for sha in stored_objects(store)} and not named & gone


def test_young_records_are_roots(project: dict[str, Path]) -> None:
    """An old unreachable object that a running build just re-committed must survive."""
    store = LocalStore(project["store"])
    orphan = cas.put_bytes(store, b"an intermediate an abandoned build left behind")
    age(project["store"], 2 * HOUR)
    records.write_task_record(store, "tokenize", "f" * 64, {"intermediate": orphan.id}, EMPTY_TOKENIZE)
    collect_garbage(store, grace_seconds=HOUR)
    assert cas.check(store, orphan.id)
    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)
    assert not store.exists(cas.object_key(orphan.sha256))
    assert records.read_task_record(store, "tokenize", "f" * 64) is None
    assert report.deleted["objects"].count == 1 and report.deleted["records"].count == 1


def test_packs_keep_nothing_alive_and_go_with_the_records_gc_collects(project: dict[str, Path]) -> None:
    """A crashed build's packs name what only its records reach: once those go, so do the packs
    holding them, and the objects are collected all the same; the kept build's plans still find
    packs (its own, or a newer plan's of the same folder that superseded them), and an unreadable
    pack goes once past the grace period."""
    store = LocalStore(project["store"])
    kept = resolve(store, "tiny@latest")
    before = {info.key for info in store.list(PACKS_PREFIX)}
    assert {key.split("/")[1] for key in before} == {"tokenize", "order", "shard"}
    crash(project["v2"], project["store"], "shard.before_commit")
    crashed = {info.key for info in store.list(PACKS_PREFIX)} - before
    assert {key.split("/")[1] for key in crashed} == {"tokenize", "order"}
    unreadable = pack_key("tokenize", "a" * 64, "b" * 64, "c" * 64)
    store.put_bytes(unreadable, b"not a pack")
    assert collect_garbage(store, grace_seconds=HOUR).freed.count == 0, "young records are roots, young packs stay"
    age(project["store"], 2 * HOUR)
    collect_garbage(store, grace_seconds=HOUR)
    left = {info.key for info in store.list(PACKS_PREFIX)}
    assert not store.exists(unreadable)
    assert any(key.split("/")[1] == "order" for key in crashed - left), "the packs of collected records are gone"
    assert {key.rsplit("/", 1)[0] for key in before} <= {key.rsplit("/", 1)[0] for key in left}, \
        "each plan of the kept build still finds packs in its folder"
    assert stored_objects(store) == reachable(store, kept.id)
    assert_records_resolve(store)
    assert fsck(store).clean, "every pack left holds records stored under their keys"
    assert run_prep("build", project["v1"], "--store", project["store"]).stdout.split()[-1] == kept.id


def packed_objects(store: Store, keys: set[str]) -> set[str]:
    """The SHA-256 hex of every object the records of the packs at `keys` name."""
    return {hashing.parse_id(object_id) for key in keys
            for record in canonical.loads(store.get_bytes(key))["records"].values()
            for object_id in record["outputs"].values()}


def test_young_packs_are_roots_and_a_build_after_gc_gives_the_same_id(project: dict[str, Path]) -> None:
    """The driver commits in groups, so a crashed build's records live only in its packs. While
    a pack is young it keeps what its records name, even objects past the grace period (a build
    re-committed them); once old, a pack naming what no snapshot reaches goes with its objects
    (memoization lost, nothing else), the kept snapshot's packs stay, and builds after gc give
    the same ids: the resumed one runs no tokenize task its young packs committed."""
    store = LocalStore(project["store"])
    kept = resolve(store, "tiny@latest")
    before = {info.key for info in store.list(PACKS_PREFIX)}
    assert before and not list(store.list(records.TASKS_PREFIX)), "a build's records live only in packs"
    crash(project["v2"], project["store"], "order.after_group")
    crashed = {info.key for info in store.list(PACKS_PREFIX)} - before
    young = packed_objects(store, crashed) - reachable(store, kept.id)
    assert {key.split("/")[1] for key in crashed} == {"tokenize", "order"} and young
    age(project["store"], 2 * HOUR)
    for key in crashed:  # the crashed build's commits are recent; its objects are old
        path = store.local_path(key)
        assert path is not None
        os.utime(path)
    collect_garbage(store, grace_seconds=HOUR)
    assert young <= stored_objects(store), "a young pack keeps what its records name"
    assert crashed <= {info.key for info in store.list(PACKS_PREFIX)}
    assert_records_resolve(store)
    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)
    left = {info.key for info in store.list(PACKS_PREFIX)}
    assert stored_objects(store) == reachable(store, kept.id) and report.deleted["records"].count == len(crashed - left)
    assert before <= left and crashed - left, "the kept snapshot's packs stay, the crashed build's new work goes"
    assert packed_objects(store, left - before) <= reachable(store, kept.id), \
        "what stays of the crashed build's packs names only kept objects (the unchanged parts' records)"
    assert_records_resolve(store)
    assert fsck(store).clean
    rebuilt = run_prep("build", project["v1"], "--store", project["store"], "--workers", "1")
    assert rebuilt.stdout.split()[-1] == kept.id
    assert {info.key for info in store.list(PACKS_PREFIX)} == left, "every task found in the packs kept"


def test_gc_waits_for_builds_and_builds_wait_for_gc(project: dict[str, Path]) -> None:
    store = LocalStore(project["store"])
    orphan = cas.put_bytes(store, b"garbage")
    age(project["store"], 2 * HOUR)
    with Lease(store, BUILD) as lease:
        assert [found.key for found in read_leases(store, BUILD)] == [lease.key]
        with pytest.raises(StoreError, match="a build holds lease"):
            collect_garbage(store, grace_seconds=0)
        assert cas.check(store, orphan.id), "nothing is deleted while a build runs"
        lease._write()  # a renewal replaces the key with a later one
        assert [found.key for found in read_leases(store, BUILD)] == [lease.key]
    assert read_leases(store) == []
    assert not (project["store"] / "leases" / BUILD / lease.run).exists()  # no folder left per run
    with Lease(store, GC), pytest.raises(StoreError, match="garbage collection is running"), \
            build_lease(store, timeout=0, poll=0.01):
        pass
    assert read_leases(store) == []


def test_expired_leases_are_ignored_and_removed(project: dict[str, Path]) -> None:
    store = LocalStore(project["store"])
    stale = lease_key(BUILD, "crashed-run", int(time.time()) - 60)
    store.put_bytes(stale, b"{}")
    orphan = cas.put_bytes(store, b"garbage of the crashed run")
    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)
    assert not store.exists(stale) and not store.exists(cas.object_key(orphan.sha256))
    assert report.deleted["leases"].count == 1
    assert not (project["store"] / "leases" / BUILD / "crashed-run").exists()


def test_a_killed_holder_releases_its_lease_only_where_its_pid_means_something(project: dict[str, Path]) -> None:
    store = LocalStore(project["store"])
    dead_pid = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_pid.wait()
    expires = int(time.time()) + 600
    elsewhere = lease_key(BUILD, "other-container", expires)
    store.put_bytes(elsewhere, json.dumps({"pid": dead_pid.pid, "scope": "host/boot/other-namespace"}).encode())
    with pytest.raises(StoreError, match="a build holds lease"):
        collect_garbage(store, grace_seconds=0)
    store.delete(elsewhere)
    here = lease_key(BUILD, "killed-run", expires)
    store.put_bytes(here, json.dumps({"pid": dead_pid.pid, "scope": process_scope()}).encode())
    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)
    assert report.deleted["leases"].count == 1 and read_leases(store) == []


def test_a_lease_named_for_a_far_date_lapses_once_the_store_holds_it_longer_than_a_lifetime(
        project: dict[str, Path]) -> None:
    """Regression: a lease key dated years ahead (a holder's clock gone wrong, a key made by hand)
    kept gc out, and builds waiting, until that date. Holders renew within a lifetime, so a key
    the store wrote longer ago than that has lapsed; a fresh one still counts (a holder running
    with its clock ahead)."""
    store = LocalStore(project["store"])
    far = int(time.time()) + 10 * 365 * 86400
    body = json.dumps({"pid": 1, "scope": "another/host/namespace"}).encode()
    fresh = lease_key(BUILD, "clock-ahead", far)
    store.put_bytes(fresh, body)
    with pytest.raises(StoreError, match="a build holds lease"):
        collect_garbage(store, grace_seconds=HOUR)
    store.delete(fresh)
    stale_build, stale_gc = lease_key(BUILD, "gone", far), lease_key(GC, "gone", far)
    for key in (stale_build, stale_gc):
        store.put_bytes(key, body)
    age(project["store"], 2 * HOUR)
    with build_lease(store, timeout=0, poll=0.01):  # the old gc lease keeps no build waiting
        pass
    report = collect_garbage(store, grace_seconds=HOUR)
    assert report.deleted["leases"].count == 2 and read_leases(store) == []


def test_a_lease_lasts_at_most_the_lifetime_others_judge_it_by() -> None:
    store = LocalStore.__new__(LocalStore)
    with pytest.raises(ValueError, match="a lease lasts"):
        Lease(store, BUILD, seconds=3600)


def test_gc_refuses_a_store_whose_ref_names_a_missing_snapshot(project: dict[str, Path]) -> None:
    store = LocalStore(project["store"])
    snapshot = resolve(store, "tiny@latest")
    store.delete(cas.object_key(hashing.parse_id(snapshot.id)))
    age(project["store"], 2 * HOUR)
    objects = stored_objects(store)
    with pytest.raises(IntegrityError, match="missing"):
        collect_garbage(store, grace_seconds=0)
    assert stored_objects(store) == objects


def _intermediate_of(store: Store, snapshot_id: str) -> str:
    """The first tokenize intermediate a snapshot needs."""
    stages = load_snapshot(store, snapshot_id).manifest["stages"]
    tokenize = next(stage for stage in stages if stage["name"] == "tokenize")
    return str(canonical.loads(cas.get_bytes(store, tokenize["output"]))["tasks"][0]["output"])


def test_gc_follows_the_ids_records_declare_not_ids_their_text_mentions(project: dict[str, Path]) -> None:
    """An id in a task summary's text names nothing: that object goes, the record stays."""
    store = LocalStore(project["store"])
    kept = resolve(store, "tiny@latest")
    orphan = cas.put_bytes(store, b"an object that only a skip reason mentions")
    summary = {**EMPTY_TOKENIZE, "bad_records": 1, "bad_record_examples": [f"line 1: no text, only {orphan.id}"]}
    age(project["store"], 2 * HOUR)
    records.write_task_record(store, "tokenize", "d" * 64, {"intermediate": _intermediate_of(store, kept.id)}, summary)
    report = collect_garbage(store, grace_seconds=HOUR)  # the young record is a root, of its outputs only
    assert report.deleted["objects"].count == 1 and not store.exists(cas.object_key(orphan.sha256))
    assert stored_objects(store) == reachable(store, kept.id)
    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)  # old now, but everything it names is kept
    assert report.freed.count == 0 and records.read_task_record(store, "tokenize", "d" * 64) is not None
    assert stored_objects(store) == reachable(store, kept.id)
    assert_records_resolve(store)


def test_gc_keeps_what_snapshots_of_every_layout_need(project: dict[str, Path]) -> None:
    """A store holding a layout-1 snapshot (tokenize, dedup, shuffle, shard) and a layout-2 one
    (tokenize, route, order, shard) beside layout-3 builds (tokenize, order, shard): gc keeps
    exactly what each ref'd snapshot needs, whatever its layout, and a layout's own objects and
    records go once no ref reaches a snapshot of it."""
    store = LocalStore(project["store"])
    new = resolve(store, "tiny@latest")
    old = plant_layout1(store, new.id)  # tiny@old: an older build of the same intermediates
    routed = plant_layout2(store, new.id)  # tiny@layout2: a build from before tokenize wrote entries
    assert [stage["name"] for stage in old.snapshot.manifest["stages"]] == ["tokenize", "dedup", "shuffle", "shard"]
    assert [stage["name"] for stage in routed.snapshot.manifest["stages"]] == ["tokenize", "route", "order", "shard"]
    assert [stage["name"] for stage in new.manifest["stages"]] == ["tokenize", "order", "shard"]
    shared = reachable(store, old.snapshot.id) & reachable(store, new.id)
    assert _intermediate_of(store, new.id).removeprefix("sha256:") in shared
    abandoned = plant_layout1(store, new.id, ref=None, salt="abandoned")  # published, then never ref'd
    crash(project["v2"], project["store"], "shard.before_commit")  # a layout-3 build's leftovers
    needed = reachable(store, new.id) | reachable(store, old.snapshot.id) | reachable(store, routed.snapshot.id)
    assert {object_id.removeprefix("sha256:") for object_id in routed.route_objects} <= needed
    assert stored_objects(store) - needed, "the abandoned snapshot and the killed build should have left objects"

    age(project["store"], 2 * HOUR)
    report = collect_garbage(store, grace_seconds=HOUR)
    assert stored_objects(store) == needed
    assert report.deleted["snapshots"].count == 1 and not store.exists(f"snapshots/{hashing.parse_id(abandoned.snapshot.id)}")
    for snapshot in (new, old.snapshot):
        assert all(cas.check(store, f"sha256:{a['sha256']}") for a in snapshot.artifacts)
        for stage in snapshot.manifest["stages"]:
            assert store.exists(stage_record_key(stage["name"], stage["key"])), stage
    assert {info.key.split("/")[1] for prefix in (records.TASKS_PREFIX, PACKS_PREFIX) for info in store.list(prefix)} == \
        {"tokenize", "dedup", "shuffle", "route", "order", "shard"}
    assert_records_resolve(store)

    old_tokenize = old.snapshot.manifest["stages"][0]
    old_parts = canonical.loads(cas.get_bytes(store, old_tokenize["output"]))["tasks"]
    assert old_tokenize["output"] != new.manifest["stages"][0]["output"]
    assert {p["output"] for p in old_parts} <= {f"sha256:{sha}" for sha in shared}
    move_ref(store, "tiny", "old", new.id)  # no ref reaches layouts 1 and 2 any more
    move_ref(store, "tiny", "layout2", new.id)
    age(project["store"], 2 * HOUR)
    collect_garbage(store, grace_seconds=HOUR)
    assert stored_objects(store) == reachable(store, new.id)
    assert not old.own_objects & stored_objects(store) and shared <= stored_objects(store)
    assert not {object_id.removeprefix("sha256:") for object_id in routed.route_objects} & stored_objects(store)
    assert not [info.key for info in [*store.list(records.TASKS_PREFIX), *store.list(records.STAGES_PREFIX)]
                if info.key.split("/")[1] in ("dedup", "shuffle", "route")]
    assert not store.exists(stage_record_key("tokenize", old_tokenize["key"])), "its manifest is gone"
    for part in old_parts:  # the old build's tokenize task records name only kept intermediates: they stay
        assert records.read_task_record(store, "tokenize", part["key"]) is not None
    assert_records_resolve(store)
    assert run_prep("build", project["v1"], "--store", project["store"]).stdout.split()[-1] == new.id


def _stage_of(store: Store, snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    stage = next(stage for stage in snapshot["stages"] if stage["name"] == name)
    body: dict[str, Any] = canonical.loads(cas.get_bytes(store, stage["output"]))
    return body


def _plant_mixed_layouts(store: LocalStore, shape: str, named: str) -> None:
    """Shapes only a store of two layouts can get wrong: each mixes layout 1 and layout 2."""
    key = "d" * 64
    latest = resolve(store, "tiny@latest")
    if shape == "snapshot whose stages mix the layouts":
        stages = [{**stage, "name": "dedup", "output": named} if stage["name"] == "order" else stage
                  for stage in latest.manifest["stages"]]
        move_ref(store, "tiny", "future", publish_manifest(store, {**latest.manifest, "stages": stages}).id)
    elif shape == "layout-1 snapshot naming a layout-2 shard manifest":
        old = plant_layout1(store, latest.id, ref=None).snapshot.manifest
        shard = next(stage for stage in latest.manifest["stages"] if stage["name"] == "shard")
        stages = [shard if stage["name"] == "shard" else stage for stage in old["stages"]]
        move_ref(store, "tiny", "future", publish_manifest(store, {**old, "stages": stages}).id)
    elif shape == "stage record naming a manifest of another stage":
        manifest = {"outputs": {"keep": named}, "documents_read": 1, "duplicates_dropped": 0}
        output = records.commit_stage(store, "dedup", key, manifest)
        store.put_bytes(stage_record_key("order", key), canonical.dumps(records.StageRecord("order", key, output).to_json()))
    else:  # a shard manifest listing a layout-2 shard and a layout-1 shard
        new_entry = _stage_of(store, latest.manifest, "shard")["shards"][0]
        old_entry = {"index": 1, "first_pos": new_entry["documents"], "documents": 1, "tokens": 2, "bin_size": 4,
                     "tar_size": 2048, "outputs": {"wds": named}, "sizes": {"wds": 2048}}
        records.commit_stage(store, "shard", key, {"shards": [new_entry, old_entry]})


def _plant_unknown_shape(store: LocalStore, shape: str, named: str) -> None:
    """A record or manifest gc cannot read the names of, naming `named` among other things."""
    key = "d" * 64
    task = records.TaskRecord("tokenize", key, {"intermediate": named}, EMPTY_TOKENIZE).to_json()
    if shape in MIXED_SHAPES:
        _plant_mixed_layouts(store, shape, named)
    elif shape == "task record of a later schema":
        store.put_bytes(task_record_key("tokenize", key), canonical.dumps({**task, "schema": "prep.task/2"}))
    elif shape == "task record with an unknown field":
        store.put_bytes(task_record_key("tokenize", key), canonical.dumps({**task, "inputs": [named]}))
    elif shape == "unreadable task record":
        store.put_bytes(task_record_key("tokenize", key), canonical.dumps(task)[:-20])
    elif shape == "stage manifest of an unknown stage":
        manifest = {"schema": "prep.stage/1", "stage": "publish", "key": key, "outputs": {"all": named}}
        output = cas.put_bytes(store, canonical.dumps(manifest)).id
        store.put_bytes(stage_record_key("dedup", key), canonical.dumps(records.StageRecord("dedup", key, output).to_json()))
    else:  # a ref naming a snapshot manifest of a later schema
        snapshot = cas.put_bytes(store, canonical.dumps({"schema": "prep.snapshot/2", "blobs": [named]}))
        move_ref(store, "tiny", "future", snapshot.id)


REFUSALS = "does not match|unreadable|not JSON|no snapshot layout|named as|named by a layout"
MIXED_SHAPES = ["snapshot whose stages mix the layouts", "layout-1 snapshot naming a layout-2 shard manifest",
                "stage record naming a manifest of another stage", "shard manifest mixing the layouts"]


@pytest.mark.parametrize("shape", ["task record of a later schema", "task record with an unknown field",
                                   "unreadable task record", "stage manifest of an unknown stage",
                                   "snapshot manifest of a later schema", *MIXED_SHAPES])
def test_gc_refuses_a_record_or_manifest_of_unknown_shape(project: dict[str, Path], shape: str) -> None:
    """gc cannot tell what such a record names, so it deletes nothing rather than guess."""
    store = LocalStore(project["store"])
    orphan = cas.put_bytes(store, b"an object only the unknown record names")
    age(project["store"], 2 * HOUR)
    _plant_unknown_shape(store, shape, orphan.id)
    before = sorted(info.key for info in store.list(""))
    for dry_run in (True, False):
        with pytest.raises(IntegrityError, match=REFUSALS):
            collect_garbage(store, grace_seconds=HOUR, dry_run=dry_run)
    assert sorted(info.key for info in store.list("")) == before
    assert cas.check(store, orphan.id)


def copy_to_s3(store_dir: Path, bucket: str) -> tuple[Store, Snapshot]:
    """The local store's objects and records in the bucket, and tiny@latest moved there (refs are
    never copied as keys: the S3 backend keeps them its own way); (the S3 store, that snapshot)."""
    local, store = LocalStore(store_dir), open_store(bucket)
    for info in local.list(""):
        if not info.key.startswith(("refs/", "history/")):
            store.put_bytes(info.key, local.get_bytes(info.key))
    snapshot = resolve(local, "tiny@latest")
    move_ref(store, "tiny", "latest", snapshot.id)
    return store, snapshot


def test_gc_on_s3(template: dict[str, Path], s3_bucket: str) -> None:  # noqa: F811
    """The same rules through the S3 backend: list mtimes, deletes, and leases as objects."""
    store, kept = copy_to_s3(template["store"], s3_bucket)
    orphan = cas.put_bytes(store, b"an intermediate of an abandoned build")
    records.write_task_record(store, "tokenize", "e" * 64, {"intermediate": orphan.id}, EMPTY_TOKENIZE)
    with Lease(store, BUILD), pytest.raises(StoreError, match="a build holds lease"):
        collect_garbage(store, grace_seconds=0)
    report = collect_garbage(store, grace_seconds=0)
    assert (report.deleted["objects"].count, report.deleted["records"].count) == (1, 1)
    assert stored_objects(store) == reachable(store, kept.id)
    assert all(cas.check(store, f"sha256:{a['sha256']}") for a in kept.artifacts)
    assert_records_resolve(store)
    assert read_leases(store) == []


# --------------------------------------------------------------------------- a full disk


def _full_store_with_temporaries(mount: Path) -> tuple[LocalStore, list[Path], Path]:
    """A full store: two stale temporaries, a young one, an orphan object (two hours old)."""
    store = LocalStore(mount / "store")
    orphan = cas.put_bytes(store, b"an object no ref reaches")
    stale = [store.staging_dir() / f"{'a' * 32}.part", store.staging_dir() / f"assemble-{'b' * 32}"]
    stale[0].write_bytes(bytes(600_000))
    stale[1].mkdir()
    (stale[1] / "shard-00000.tar").write_bytes(bytes(400_000))
    age(store.root, 2 * HOUR)
    young = store.staging_dir() / f"tokenize-{'c' * 32}.part"
    young.write_bytes(bytes(10_000))
    fill_up(mount)
    assert store.exists(cas.object_key(orphan.sha256))
    return store, stale, young


def _gc(store: LocalStore) -> subprocess.CompletedProcess[str]:
    return run_prep("gc", "--store", store.root, "--grace", "1h", check=False)


def test_gc_on_a_full_disk_first_deletes_stale_temporaries_then_collects(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "2m") as mount:
        store, stale, young = _full_store_with_temporaries(mount)
        result = _gc(store)
        assert result.returncode == 0, result.stderr
        assert not any(path.exists() for path in stale) and young.exists()
        lines = result.stdout.splitlines()
        assert any(line.split()[:3] == ["deleted", "temporary", "2"] for line in lines), result.stdout
        assert any(line.split()[:3] == ["deleted", "objects", "1"] for line in lines), result.stdout
        assert stored_objects(store) == set() and read_leases(store) == []


def test_gc_on_a_full_disk_with_nothing_stale_deletes_nothing_and_says_so(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "2m") as mount:
        store, stale, young = _full_store_with_temporaries(mount)
        stale[0].unlink()
        shutil.rmtree(stale[1])
        fill_up(mount)  # what the removals freed
        objects = stored_objects(store)
        result = _gc(store)
        assert result.returncode == 4, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
        line = result.stderr.strip()
        assert line.startswith(f"prep: error: writing {store.root}/leases/gc/") and "No space left on device" in line
        assert "no temporaries in tmp/ older than the grace period" in line and "deleted no objects" in line
        assert stored_objects(store) == objects, "objects are never deleted without the lease"
        assert young.exists()


def test_gc_on_a_full_disk_leaves_temporaries_alone_while_a_build_holds_its_lease(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "2m") as mount:
        store = LocalStore(mount / "store")
        with Lease(store, BUILD) as lease:
            stale = store.staging_dir() / f"{'d' * 32}.part"
            stale.write_bytes(bytes(100_000))
            age(store.staging_dir(), 2 * HOUR)
            fill_up(mount)
            result = _gc(store)
            assert result.returncode == 4, result.stderr
            assert f"a build holds lease {lease.key}, so gc deleted nothing" in result.stderr
            assert stale.exists()


@pytest.mark.parametrize(("text", "seconds"), [("0", 0), ("45s", 45), ("30m", 1800), ("6h", 21600),
                                               ("2d", 172800), ("1w", 604800), ("1.5h", 5400)])
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "3 days", "-1h", "2y"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="invalid duration"):
        parse_duration(text)


def test_gc_keeps_the_step_sources_a_kept_snapshot_carries_and_frees_the_others(tmp_path: Path,
                                                                                tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=4))
    with user_package(tmp_path, "gcsteps", {"rules.py": RULES, "helpers.py": HELPERS}) as name:
        pipeline = write_pipeline(tmp_path, tokenizer_path, shard_size="2KB",
                                  extra=f'\n[[steps]]\nuse = "{name}.rules:mark"\n\n[retention]\nkeep_last = 1\n')
        store_path = tmp_path / "store"
        first = run_prep("build", pipeline, "--store", store_path, "--workers", "1").stdout.split()[-1]
        (tmp_path / name / "helpers.py").write_text(HELPERS + "# an edit: a new helpers.py, the same outputs\n")
        second = run_prep("build", pipeline, "--store", store_path, "--workers", "1").stdout.split()[-1]
    store = LocalStore(store_path)
    carried = {snapshot: {entry["path"]: hashing.parse_id(entry["object"])
                          for entry in load_snapshot(store, snapshot).manifest["step_sources"]}
               for snapshot in (first, second)}
    assert sorted(carried[second]) == [f"{name}/__init__.py", f"{name}/helpers.py", f"{name}/rules.py"]
    assert carried[first][f"{name}/rules.py"] == carried[second][f"{name}/rules.py"]
    assert carried[first][f"{name}/helpers.py"] != carried[second][f"{name}/helpers.py"]

    age(store_path, 2 * HOUR)
    collect_garbage(store, grace_seconds=HOUR)
    assert stored_objects(store) == reachable(store, second)
    assert set(carried[second].values()) <= stored_objects(store), "the kept snapshot's step sources stay"
    assert carried[first][f"{name}/helpers.py"] not in stored_objects(store), "the old snapshot's edited one went"
    assert all(cas.check(store, f"sha256:{sha}") for sha in carried[second].values())
