"""Garbage collection: delete objects and commit records that no ref reaches, never what a ref
reaches and never what a build in progress may still commit.

The rules (docs/history.md has the reasoning):
1. Roots: the snapshots the retention rules keep (`prep.store.retention`: every current ref, the
   last N generations of each ref, what is younger than keep_within, every held snapshot; a kept
   generation whose history record is missing is the next one's `previous`, or, failing that,
   every stored snapshot), plus
   every snapshot marker, stage record, task record and task record pack (`prep.store.packs`:
   the driver commits tasks in groups, a pack each) younger than the grace period (what a build
   in progress may have written or re-committed). The walk is `prep.store.reach`'s.
2. Kept: the roots' snapshot manifests and artifacts, their stage manifests, every object a kept
   stage manifest or young record names. What a record or manifest names is what its type
   declares (prep.store.records), for snapshots of any layout (layout 1: tokenize, dedup,
   shuffle, shard; layout 2: tokenize, route, order, shard; layout 3: tokenize, order, shard).
   One of unknown shape makes gc
   refuse, deleting nothing: a record or manifest its schema refuses, a snapshot whose stages are
   no layout, a stage manifest of another stage or layout than what names it.
3. Deleted once older than the grace period: objects not kept; records naming any object not
   kept; markers of snapshots not kept; expired leases; stale temporaries of a local store.
   A pack older than the grace period goes whole when any record in it names an object not
   kept (that record goes with its objects; a later build must not find it): its other records
   go too, which only loses their memoization (those tasks run again and store the same
   objects), never a snapshot's bytes, since what a kept snapshot reaches is kept by the
   snapshot, not the pack. Also past the grace period: packs that do not read (a damaged
   commit: its tasks run again), and packs of a plan that a newer one in the same folder
   superseded (`packs.superseded`: the newest plan's packs hold each of their records, so a
   lookup of the old plan still finds them), unless the plan has a pack younger than the grace
   period (a build of it is recent: its resume reads all of the plan's packs).
   All count as records.
4. Exclusion: gc holds a gc lease and refuses to start while a live build lease exists; builds
   take a build lease (`prep.store.leases.build_lease`) and wait while a gc lease lives. Each
   writes its own lease before looking for the other's, so the two never overlap.
5. Order: markers and records go before objects, so an interrupted gc never leaves a record
   that names a missing object.
6. Full disk: when the gc lease cannot be written for lack of space, gc first deletes the stale
   temporaries of the store's own staging folder (`Store.stale_staging`) without a lease (nothing names a temporary, and those of
   a build in progress are younger than the grace period), then tries the lease again.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, StorageIOError, StoreError, UsageError
from prep.storage.backend import ObjectInfo, Store
from prep.store import packs, proven, records, retention
from prep.store.holds import list_holds
from prep.store.layout import (
    OBJECTS_PREFIX,
    PACKS_PREFIX,
    READBACK_PREFIX,
    SNAPSHOTS_PREFIX,
    STAGES_PREFIX,
    TASKS_PREFIX,
    is_marker_key,
    lease_folder,
    leases_prefix,
    marker_sha,
    object_sha,
    readback_sha,
)
from prep.store.leases import BUILD, GC, Lease, held, live_leases, parse_lease
from prep.store.reach import Reach, parallel
from prep.store.retention import RULES, Kept, Override, Policy
from prep.store.retention import parse_duration as parse_duration  # re-exported for callers of gc

REPORT_SCHEMA = "prep.gc-report/2"
DEFAULT_GRACE = "24h"
CATEGORIES = ("objects", "records", "snapshots", "leases", "temporary")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


# ------------------------------------------------------------------------------------ report


@dataclass(frozen=True)
class Tally:
    count: int = 0
    bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "bytes": self.bytes}


def _tally(infos: Iterable[ObjectInfo]) -> Tally:
    items = list(infos)
    return Tally(len(items), sum(info.size for info in items))


@dataclass(frozen=True)
class GcReport:
    """What gc kept and deleted (or, in a dry run, would delete), by category."""

    store: str
    dry_run: bool
    grace_seconds: int
    refs: int
    kept: dict[str, Tally] = field(default_factory=dict)
    deleted: dict[str, Tally] = field(default_factory=dict)
    policies: dict[str, Policy] = field(default_factory=dict)
    rules: tuple[Kept, ...] = ()

    @property
    def freed(self) -> Tally:
        return Tally(sum(t.count for t in self.deleted.values()), sum(t.bytes for t in self.deleted.values()))

    def to_json(self) -> dict[str, Any]:
        return {"schema": REPORT_SCHEMA, "store": self.store, "dry_run": self.dry_run,
                "grace_seconds": self.grace_seconds, "refs": self.refs,
                "kept": {name: tally.to_json() for name, tally in self.kept.items()},
                "deleted": {name: tally.to_json() for name, tally in self.deleted.items()},
                "freed": self.freed.to_json(),
                "policies": {name: {"keep_last": policy.keep_last, "keep_within_seconds": policy.keep_within,
                                    "source": policy.source} for name, policy in self.policies.items()},
                "rules": {rule: [kept.to_json() for kept in self.rules if kept.rule == rule] for rule in RULES}}


# ------------------------------------------------------------------------------ reachability


def _record_names(store: Store, key: str) -> records.Names:
    """The ids a commit record declares (none if deleted meanwhile); IntegrityError for an unknown shape."""
    try:
        raw = store.get_bytes(key)
    except NotFoundError:
        return records.Names()
    return records.parse_record(key, raw, f"{store.url}/{key}").names()


def _shas(names: records.Names) -> set[str]:
    """Every SHA-256 hex `names` holds, objects and manifests alike."""
    return {hashing.parse_id(object_id) for object_id in names.objects | {ref.object_id for ref in names.manifests}}


@dataclass(frozen=True)
class _Packs:
    """Every task record pack: its listing, and its records or why it does not read."""

    listed: list[ObjectInfo]
    read: list[dict[str, records.TaskRecord] | IntegrityError]

    @classmethod
    def of(cls, store: Store) -> _Packs:
        listed = list(store.list(PACKS_PREFIX))
        return cls(listed, parallel(lambda info: packs.read_pack(store, info.key), listed))

    def young(self, cutoff: float) -> dict[str, records.Names]:
        """What each readable pack younger than the grace period names: roots, as young records are."""
        return {info.key: packs.pack_names(pack) for info, pack in zip(self.listed, self.read)
                if info.mtime > cutoff and not isinstance(pack, IntegrityError)}

    def dead(self, cutoff: float, kept: set[str]) -> tuple[list[ObjectInfo], list[ObjectInfo]]:
        """(dead, live): past the grace period, a pack is dead when it does not read, when a record
        in it names an object not kept, or when a newer plan of its folder superseded its own."""
        dead: list[ObjectInfo] = []
        live: list[tuple[ObjectInfo, dict[str, records.TaskRecord]]] = []
        for info, pack in zip(self.listed, self.read):
            if info.mtime <= cutoff and (isinstance(pack, IntegrityError) or not packs.pack_shas(pack) <= kept):
                dead.append(info)
            else:  # a young pack that does not read stays, holding nothing
                live.append((info, {} if isinstance(pack, IntegrityError) else pack))
        gone = packs.superseded(live, cutoff)
        return dead + [info for info, _ in live if info.key in gone], [info for info, _ in live if info.key not in gone]


@dataclass(frozen=True)
class _Plan:
    """Everything to delete, by category, in deletion order."""

    deletions: dict[str, list[ObjectInfo]]
    kept: dict[str, Tally]
    refs: int
    policies: dict[str, Policy]
    rules: tuple[Kept, ...]


def retention_roots(store: Store, override: Override | None, now: float) -> tuple[dict[str, Policy], list[Kept]]:
    """Each dataset's policy, and every snapshot a retention rule keeps (refs first)."""
    chosen = retention.policies(store, override)
    holds = [Kept("holds", hold.snapshot, hold.dataset, f"hold: {hold.reason}" if hold.reason else "hold")
             for hold in list_holds(store)]
    return chosen, [*retention.retained(store, chosen, now), *holds]


def _reach(store: Store, cutoff: float, markers: list[ObjectInfo], named: dict[str, records.Names],
           young: list[ObjectInfo], rules: list[Kept]) -> Reach:
    """What the roots reach: the retention rules' snapshots, young snapshot markers, young
    records and packs (`named` holds what each names)."""
    reach = Reach(store)
    for kept in rules:  # only a current ref's snapshot must exist; history may name collected ones
        reach.snapshot(hashing.parse_id(kept.snapshot), kept.by, required=kept.rule == "refs")
    for marker in markers:
        if marker.mtime > cutoff and is_marker_key(marker.key):  # a stray key names no snapshot: garbage
            reach.snapshot(marker_sha(marker.key), marker.key, required=False)
    for info in young:
        reach.names(named[info.key], info.key, required=False)
    return reach


def _plan(store: Store, cutoff: float, now: float, override: Override | None, store_now: float | None = None) -> _Plan:
    objects = list(store.list(OBJECTS_PREFIX))
    found = list(store.list(TASKS_PREFIX)) + list(store.list(STAGES_PREFIX))
    markers = list(store.list(SNAPSHOTS_PREFIX))
    named = dict(zip((info.key for info in found), parallel(lambda info: _record_names(store, info.key), found)))
    stored_packs = _Packs.of(store)
    young_packs = stored_packs.young(cutoff)
    chosen, rules = retention_roots(store, override, now)
    young = [info for info in found if info.mtime > cutoff]
    young += [info for info in stored_packs.listed if info.key in young_packs]
    reach = _reach(store, cutoff, markers, {**named, **young_packs}, young, rules)
    dead_records = [info for info in found if info.mtime <= cutoff and not _shas(named[info.key]) <= reach.kept]
    # A read-back record vouches for a snapshot's objects: it goes with the snapshot, or a
    # re-stored manifest object would be trusted on a proof of bytes gc deleted.
    dead_records += [info for info in store.list(READBACK_PREFIX)
                     if info.mtime <= cutoff and readback_sha(info.key) not in reach.kept]
    dead_packs, live_packs = stored_packs.dead(cutoff, reach.kept)
    expired = [info for info in store.list(leases_prefix())
               if info.mtime <= cutoff and ((lease := parse_lease(info)) is None or not held(store, lease, now, store_now))]
    deletions = {
        "snapshots": [m for m in markers if m.mtime <= cutoff and marker_sha(m.key) not in reach.kept],
        "records": dead_records + dead_packs,
        "leases": expired,
        "objects": [o for o in objects if o.mtime <= cutoff and object_sha(o.key) not in reach.kept],
        "temporary": store.stale_staging(cutoff),
    }
    dead_keys = {info.key for info in dead_records}
    kept = {"objects": _tally(o for o in objects if object_sha(o.key) in reach.kept),
            "records": _tally([*(info for info in found if info.key not in dead_keys), *live_packs])}
    refs = sum(1 for rule in rules if rule.rule == "refs")
    return _Plan(deletions, kept, refs, chosen, tuple(rule for rule in rules if hashing.parse_id(rule.snapshot) in reach.kept))


def _delete(store: Store, category: str, infos: list[ObjectInfo]) -> None:
    if category == "temporary":
        for info in infos:
            store.delete_staging(info)
        return
    parallel(lambda info: store.delete(info.key), infos)
    if category == "leases":  # an expired lease's run folder (a crashed build's) goes with it
        for lease in filter(None, map(parse_lease, infos)):
            store.remove_empty_folder(lease_folder(lease.kind, lease.run))


def collect_garbage(store: Store, grace_seconds: int, dry_run: bool = False,
                    policy: Override | None = None) -> GcReport:
    """Delete (or with `dry_run` only count) what no retention rule keeps and is older than the
    grace period; `policy` (gc's flags) overrides parts of every dataset's recorded one. Raises StoreError without
    deleting anything while a build holds a live lease."""
    if grace_seconds < 0:
        raise UsageError(f"grace period must not be negative, got {grace_seconds} s")
    if dry_run:
        now = time.time()
        plan = _plan(store, now - grace_seconds, now, policy)
        return GcReport(store.url, True, grace_seconds, plan.refs, plan.kept,
                        {name: _tally(plan.deletions[name]) for name in CATEGORIES}, plan.policies, plan.rules)
    with ExitStack() as stack:
        freed: list[ObjectInfo] = []  # stale temporaries deleted without a lease (a full disk)
        try:
            lease = stack.enter_context(Lease(store, GC))
        except StorageIOError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            freed = _free_temporaries(store, grace_seconds, exc)
            try:
                lease = stack.enter_context(Lease(store, GC))
            except StorageIOError as again:
                if again.errno not in _NO_SPACE:
                    raise
                raise StorageIOError(again.operation, again.path, f"{again.reason}; {_freed_text(freed)}",
                                     again.errno) from again
        builds = live_leases(store, BUILD, store_now=lease.store_now())
        if builds:
            raise StoreError(f"{store.url}: a build holds lease {builds[0].key}; gc deletes nothing while "
                             "builds run, try again later")
        now = time.time()
        plan = _plan(store, now - grace_seconds, now, policy, lease.store_now())
        for name in ("snapshots", "records", "leases", "objects", "temporary"):
            if lease.lapsed:
                raise StoreError(f"{store.url}: the gc lease lapsed (renewals failed); stopped before deleting {name}")
            _delete(store, name, [info for info in plan.deletions[name] if info.key != lease.key])
        proven.forget(store, (f"sha256:{object_sha(info.key)}" for info in plan.deletions["objects"]))
        deleted = {name: _tally(plan.deletions[name]) for name in CATEGORIES}
        deleted["temporary"] = _tally([*freed, *plan.deletions["temporary"]])
        return GcReport(store.url, False, grace_seconds, plan.refs, plan.kept, deleted, plan.policies, plan.rules)


def _free_temporaries(store: Store, grace_seconds: int, cause: StorageIOError) -> list[ObjectInfo]:
    """Without a lease (the disk is full), delete only staging entries older than the grace period."""
    # Safe without the gc lease: nothing names a temporary, so deleting one can never leave the
    # store inconsistent; a build in progress touches its temporaries within the grace period,
    # and one that starts after the cutoff is fixed makes only newer ones. Still, no deleting at
    # all while a build holds a live lease.
    cutoff = time.time() - grace_seconds  # fixed before looking for builds
    builds = live_leases(store, BUILD)
    if builds:
        raise StorageIOError(cause.operation, cause.path, f"{cause.reason}; a build holds lease {builds[0].key}, "
                             "so gc deleted nothing", cause.errno) from cause
    stale = store.stale_staging(cutoff)
    _delete(store, "temporary", stale)
    return stale


def _freed_text(freed: list[ObjectInfo]) -> str:
    """What a gc that never got its lease did, for its error message."""
    done = (f"without a lease gc deleted only {len(freed)} stale temporaries ({sum(i.size for i in freed)} bytes) "
            "from tmp/" if freed else "gc found no temporaries in tmp/ older than the grace period")
    return f"{done} and deleted no objects or records (they need the lease): free space and run gc again"
