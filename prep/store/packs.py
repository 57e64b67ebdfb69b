"""Task record packs (`prep.task-pack/1`): one create-only object holding many task records, the
commit of all of them at once (the driver commits settled tasks in groups, prep/runner/driver.py),
which planning reads before it looks for single records.

A plan (one stage's task keys) is named by the SHA-256 over its sorted keys, one a line; its
packs go under `packs/<stage>/<anchor>/`, the anchor being its smallest key, and are named
`<plan>-<hex>.json` by the SHA-256 of their bytes. A resume of the same plan lists its anchor's
folder and reads its own packs; a plan that differs by a few keys (a build that appends a file)
almost always keeps the anchor (or has it as its second smallest key: both folders are listed),
so it finds the packs of the build before and reads the newest such plan's; when the anchors'
folders hold no pack at all (the edit replaced the old smallest key), the stage's other plans',
newest first until one answers (a stage may hold several plans a build: the merge levels).

A pack is written only after every object its records name is stored, so it may be the only copy
of a record (a single record `tasks/<stage>/<key>.json` is written only where a build commits one
task at a time: an armed crash point, a plan with no packs, stores written before grouped commits).
Read back, a pack must hash to its name, match its schema, its key's stage and plan, and every
record in it must pass as a single record read does (`prep.task/1`, filed under its own key, of
the pack's stage): one that fails is ignored whole and reported, never trusted (its tasks are
then not committed: they run again and commit again). Two copies of a task's record naming other
outputs (a determinism bug) stop the lookup. Keys no pack answered are looked for among the single
records by listing `tasks/<stage>/` (sixteen listings in parallel, by the key's first hex digit)
when there are many, so a first build sends no request per task; only keys the listing shows are
read. Records found other than in the plan's own packs are packed under it, so the next lookup of
the same plan reads packs only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from prep import hashing
from prep.errors import IntegrityError, NotFoundError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.storage.backend import ObjectInfo, Store
from prep.storage.parallel import in_sequence
from prep.store import records
from prep.store.layout import (
    RECORD_SUFFIX,
    is_sha_hex,
    pack_key,
    pack_prefix,
    pack_stage_prefix,
    parse_pack_key,
    task_record_prefix,
)

PACK_SCHEMA = "prep.task-pack/1"
HEX_DIGITS = "0123456789abcdef"
ANCHORS = 2
"""A plan's smallest keys whose folders a lookup lists: the second finds the packs of a plan that
lacked this plan's smallest key (a file appended whose part sorts first)."""


@dataclass(frozen=True)
class Plan:
    """One stage's task keys as packs know them: the hash naming them and their smallest keys
    (none when a key is no SHA-256 hex: such a plan has no packs)."""

    stage: str
    plan: str
    anchors: tuple[str, ...]

    @classmethod
    def of(cls, stage: str, keys: Iterable[str]) -> Plan:
        """The plan of `keys` in any order (the same keys, the same plan)."""
        ordered = sorted(set(keys))
        digest = hashlib.sha256("\n".join(ordered).encode()).hexdigest()
        anchors = tuple(ordered[:ANCHORS])
        return cls(stage, digest, anchors if anchors and all(map(is_sha_hex, anchors)) else ())


@dataclass(frozen=True)
class Found:
    """What packs answered for a lookup: the wanted keys' records, those of them the plan's own
    packs held, and each pack that failed its check (one line each)."""

    records: dict[str, records.TaskRecord]
    own: frozenset[str]
    problems: tuple[str, ...]


def pack_bytes(plan: Plan, batch: Sequence[records.TaskRecord]) -> bytes:
    """The canonical bytes of a pack of `batch`, checked first: never store an invalid one."""
    body = {"schema": PACK_SCHEMA, "stage": plan.stage, "plan": plan.plan,
            "records": {record.key: record.to_json() for record in batch}}
    validate(body, PACK_SCHEMA, f"new task pack of {plan.stage}")
    if any(record.stage != plan.stage for record in batch):
        raise IntegrityError(f"a task pack of {plan.stage} would hold records of another stage")
    return canonical.dumps(body)


def write_pack(store: Store, plan: Plan, batch: Sequence[records.TaskRecord]) -> str | None:
    """Commit records of `plan` (their objects stored) as one pack, create-only (one PUT); its
    key, None when there is nothing to write or the plan has no packs. A pack already stored under
    the name must be these bytes (another writer's same group); a corrupt or vanished copy is
    replaced, as `cas` replaces an object's (the name is the hash of the bytes)."""
    if not batch or not plan.anchors:
        return None
    raw = pack_bytes(plan, batch)
    key = pack_key(plan.stage, plan.anchors[0], plan.plan, hashlib.sha256(raw).hexdigest())
    if not store.put_bytes(key, raw) and not _holds(store, key, raw):
        store.delete(key)
        if not store.put_bytes(key, raw) and not _holds(store, key, raw):
            raise IntegrityError(f"{store.url}/{key}: a task pack is stored with other bytes and could not be replaced")
    return key


def _holds(store: Store, key: str, raw: bytes) -> bool:
    """Whether `key` holds exactly `raw`."""
    try:
        return store.get_bytes(key) == raw
    except NotFoundError:
        return False


def parse_pack(key: str, raw: bytes, source: str) -> dict[str, records.TaskRecord]:
    """The records of the pack stored at `key`, by task key, every check passed; IntegrityError
    naming `source` and what failed otherwise."""
    named = parse_pack_key(key)
    if named is None:
        raise IntegrityError(f"{source}: {key!r} is no task pack key")
    stage, _, plan, sha = named
    if hashlib.sha256(raw).hexdigest() != sha:
        raise IntegrityError(f"{source}: does not hash to its name (corrupt or truncated)")
    try:
        body = canonical.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"{source}: unreadable task pack ({exc})") from None
    validate(body, PACK_SCHEMA, source)
    if body["stage"] != stage or body["plan"] != plan:
        raise IntegrityError(f"{source}: a pack of {body['stage']} plan {body['plan']}, filed under {stage} plan {plan}")
    found = {}
    for task_key, data in body["records"].items():
        record = records.TaskRecord.from_json(data, f"{source}: record {task_key}")
        if record.key != task_key or record.stage != stage:
            raise IntegrityError(f"{source}: holds the record of task {record.stage}/{record.key} as {stage}/{task_key}")
        found[task_key] = record
    return found


def read_pack(store: Store, key: str) -> dict[str, records.TaskRecord] | IntegrityError:
    """The records of a stored pack (none when it vanished), or why it is unusable."""
    try:
        return parse_pack(key, store.get_bytes(key), f"{store.url}/{key}")
    except NotFoundError:
        return {}
    except IntegrityError as exc:
        return exc


def pack_names(held: dict[str, records.TaskRecord]) -> records.Names:
    """Every object the records of a pack name."""
    return records.Names(objects=frozenset(object_id for record in held.values() for object_id in record.names().objects))


def pack_shas(held: dict[str, records.TaskRecord]) -> set[str]:
    """The SHA-256 hex of every object the records of a pack name."""
    return {hashing.parse_id(object_id) for object_id in pack_names(held).objects}


def superseded(held: Sequence[tuple[ObjectInfo, dict[str, records.TaskRecord]]], cutoff: float) -> set[str]:
    """The keys of packs older than `cutoff` whose plan is not the newest (by its newest pack) in
    its anchor's folder, has no pack younger than `cutoff`, and whose every record the newest
    plan's packs hold too: a lookup reads its own plan's packs and the newest other plan's there,
    so such packs serve no lookup the newest does not. A build of a plan packs every record it
    finds, so a chain of appending rebuilds leaves each older plan's records in the next one; a
    plan whose records the newest lacks (another version's changed parts) keeps its packs, and a
    plan with a young pack was built lately (a crashed build may resume it): none of its packs go."""
    newest: dict[tuple[str, str], tuple[float, str]] = {}
    recent: set[tuple[str, str, str]] = set()
    named = [(info, parse_pack_key(info.key), pack) for info, pack in held]
    for info, name, _ in named:
        if name is not None:
            folder = (name[0], name[1])
            newest[folder] = max(newest.get(folder, (info.mtime, name[2])), (info.mtime, name[2]))
            if info.mtime > cutoff:
                recent.add(name[:3])
    latest: dict[tuple[str, str], dict[str, records.TaskRecord]] = {}
    for _, name, pack in named:
        if name is not None and newest[(name[0], name[1])][1] == name[2]:
            latest.setdefault((name[0], name[1]), {}).update(pack)
    return {info.key for info, name, pack in named
            if name is not None and info.mtime <= cutoff and newest[(name[0], name[1])][1] != name[2]
            and name[:3] not in recent and _held_by(pack, latest[(name[0], name[1])])}


def _held_by(pack: dict[str, records.TaskRecord], newest: dict[str, records.TaskRecord]) -> bool:
    """Whether every record of `pack` is in `newest`, the same."""
    return all(newest.get(key) == record for key, record in pack.items())


def _by_plan(store: Store, stage: str, prefixes: Iterable[str]) -> dict[str, list[ObjectInfo]]:
    """The stage's packs under `prefixes`, by the plan that wrote them (a LIST each)."""
    listed: dict[str, list[ObjectInfo]] = {}
    for prefix in prefixes:
        for info in store.list(prefix):
            named = parse_pack_key(info.key)
            if named is not None and named[0] == stage:
                listed.setdefault(named[2], []).append(info)
    return listed


def _read(store: Store, infos: Sequence[ObjectInfo], wanted: Collection[str], jobs: int,
          found: dict[str, records.TaskRecord], problems: list[str]) -> None:
    """Read `infos` `jobs` at a time, adding the wanted records of each usable one to `found`."""
    reads = (partial(read_pack, store, info.key) for info in infos)
    for info, held in zip(infos, in_sequence(reads, jobs, "prep-packs")):
        if isinstance(held, IntegrityError):
            problems.append(held.message)
            continue
        for key, record in held.items():
            if key in wanted:
                agree(found.setdefault(key, record), record, f"{store.url}/{info.key}")


def agree(first: records.TaskRecord, other: records.TaskRecord, source: str) -> None:
    """Two copies of a task's record must name the same outputs (the same key, other bytes: a
    determinism bug, as a create-only commit that meets another record reports it)."""
    if first.outputs != other.outputs:
        raise IntegrityError(f"{source}: task {other.stage}/{other.key} was committed with different outputs "
                             "elsewhere (prep fsck finds both copies)")


def lookup(store: Store, plan: Plan, wanted: Collection[str], jobs: int) -> Found:
    """The wanted keys' records that packs hold: the plan's own packs first, then, for what they
    leave, the packs of the other plans sharing an anchor, or, when the anchors' folders hold no
    pack at all (an edit replaced the key that anchored the plan before, or the stage never ran),
    the other plans of the stage (a LIST of every pack of the stage: a page per 1,000 packs). Of
    those, newest first (by their packs' newest mtime), until one answers any key, at most
    `OTHER_PLANS`: a stage may hold several plans of one build (the merge levels), and the newest
    of them need not be the one this plan's tasks were in before. (Reading on past one that
    answered would cost a build that appends a file a plan's packs it never needs.)"""
    listed = _by_plan(store, plan.stage, map(partial(pack_prefix, plan.stage), plan.anchors)) if plan.anchors else {}
    found: dict[str, records.TaskRecord] = {}
    problems: list[str] = []
    _read(store, listed.pop(plan.plan, []), wanted, jobs, found, problems)
    own = frozenset(found)
    if plan.anchors and not listed and not found and wanted:
        listed = _by_plan(store, plan.stage, [pack_stage_prefix(plan.stage)])
        listed.pop(plan.plan, None)
    newest_first = sorted(listed, key=lambda other: max(info.mtime for info in listed[other]), reverse=True)
    for other in newest_first[:OTHER_PLANS]:
        if len(found) == len(wanted):
            break
        before = len(found)
        _read(store, listed[other], {key for key in wanted if key not in found}, jobs, found, problems)
        if len(found) > before:
            break
    return Found(found, own, tuple(problems))


OTHER_PLANS = 4
"""Other plans a lookup reads at most while none answers: a build's plans of one stage (the levels
of a merge) and a few builds before it; each costs a GET a pack of it (a pack per 1,000 tasks)."""


LIST_ABOVE = 16
"""Keys no pack answered beyond which planning lists the stage's single records rather than read each
key's single record: one round of sixteen listings costs what one round of reads does."""


def _listed(store: Store, prefix: str) -> list[ObjectInfo]:
    return list(store.list(prefix))


def single_records(store: Store, stage: str, jobs: int) -> set[str]:
    """The task keys of the stage's single records, by listing (on a remote store sixteen
    listings in parallel, one a first hex digit of the key; on a local one, one walk)."""
    folder = task_record_prefix(stage)
    prefixes = [folder] if store.local_path(folder) is not None else [f"{folder}{digit}" for digit in HEX_DIGITS]
    found: set[str] = set()
    for infos in in_sequence((partial(_listed, store, prefix) for prefix in prefixes), jobs, "prep-list"):
        found.update(info.key[len(folder):-len(RECORD_SUFFIX)] for info in infos if info.key.endswith(RECORD_SUFFIX))
    return found


def find_committed(store: Store, stage: str, keys: Sequence[str], jobs: int, pack_records: int,
                   warn: Callable[[str], None], repack: bool = True) -> dict[str, records.TaskRecord | None]:
    """Each key's committed record or None: packs first (`pack_records` 0: none), then the single
    records of keys no pack answered: read one GET each, `jobs` at a time, when they are few, and
    otherwise only those a listing of the stage's records shows (a first build sends no request a
    task; a record a listing missed only makes its task run and commit again). With `repack`,
    records found other than in the plan's own packs are packed under it, `pack_records` a pack;
    each unusable pack is `warn`ed about."""
    plan = Plan.of(stage, keys)
    packed = lookup(store, plan, set(keys), jobs) if pack_records > 0 else Found({}, frozenset(), ())
    for problem in packed.problems:
        warn(f"warning: an unusable task pack is ignored ({problem}); its tasks run again unless committed elsewhere")
    missing = [key for key in keys if key not in packed.records]
    if len(missing) > LIST_ABOVE:
        listed = single_records(store, stage, jobs)
        missing = [key for key in missing if key in listed]
    gets = (partial(records.read_task_record, store, stage, key) for key in missing)
    fetched = dict(zip(missing, in_sequence(gets, jobs, "prep-lookup")))
    if pack_records > 0 and repack:
        unpacked = [record for key, record in (*packed.records.items(), *fetched.items())
                    if record is not None and key not in packed.own]
        batches = (partial(write_pack, store, plan, unpacked[at:at + pack_records])
                   for at in range(0, len(unpacked), pack_records))
        list(in_sequence(batches, jobs, "prep-packs"))
    return {key: packed.records.get(key) or fetched.get(key) for key in keys}
