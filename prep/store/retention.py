"""Retention: which snapshots garbage collection keeps beyond what current refs name.

A dataset's policy (`keep_last`, `keep_within`) comes from its pipeline file's `[retention]`
table; each build records it in the store (`layout.retention_key`, create-only versions, the
highest generation current), so `prep gc` applies every dataset's own policy without being
handed pipeline files, and gc flags override it. The rules, each listed by `gc --dry-run --json`:
refs (every current ref: `latest` and every tag), keep_last (the last N generations of each ref,
from `history/`), keep_within (every generation younger than the duration, and every snapshot
published within it), holds (`prep.store.holds`). A generation these rules keep whose history
record is missing is kept as the snapshot the next generation names as `previous`; when no
record names it, every stored snapshot is kept rather than a guess made.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import defaultdict
from dataclasses import dataclass, replace

from prep import hashing
from prep.errors import IntegrityError, UsageError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.storage.backend import Store
from prep.store import cas
from prep.store.layout import (
    HISTORY_PREFIX,
    RECORD_SUFFIX,
    RETENTION_PREFIX,
    SNAPSHOTS_PREFIX,
    is_decimal,
    is_marker_key,
    marker_sha,
    retention_key,
    valid_name,
)
from prep.store.refs import TIME_FORMAT, Ref, list_refs, ref_history

POLICY_SCHEMA = "prep.retention/1"
RULES = ("refs", "keep_last", "keep_within", "holds")
MAX_RECORD_ATTEMPTS = 20
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> int:
    """'30m' -> 1800, '6h', '2d', '1w', '45s', or bare seconds; UsageError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(f"invalid duration {text!r}: use a number with s, m, h, d or w, like 30m, 6h or 2d")
    return int(float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@dataclass(frozen=True)
class Policy:
    """How many generations of each ref to keep, and for how long to keep every snapshot.
    The default keeps only what current refs name (keep_last 1, keep_within 0)."""

    keep_last: int = 1
    keep_within: int = 0  # seconds
    source: str = "default"  # where it came from: default, store, pipeline or flags

    def to_json(self, dataset: str) -> dict[str, object]:
        return {"schema": POLICY_SCHEMA, "dataset": dataset, "keep_last": self.keep_last,
                "keep_within_seconds": self.keep_within}


def check_policy(keep_last: int, keep_within: int, source: str) -> Policy:
    """A policy, or UsageError naming what is wrong (keep_last at least 1, keep_within not negative)."""
    if keep_last < 1:
        raise UsageError(f"{source}: keep_last must be at least 1 (the current generation), got {keep_last}")
    if keep_within < 0:
        raise UsageError(f"{source}: keep_within must not be negative, got {keep_within} s")
    return Policy(keep_last, keep_within, source)


def _policy_keys(store: Store, dataset: str) -> list[str]:
    """The dataset's policy versions, oldest first (the last is current)."""
    return [info.key for info in store.list(f"{RETENTION_PREFIX}{dataset}/") if info.key.endswith(RECORD_SUFFIX)]


def _generation(key: str) -> int | None:
    """The generation a policy version's key names (`<16 digits>.json`), or None for a stray key."""
    parts = key[len(RETENTION_PREFIX):].split("/")
    stem = parts[-1].removesuffix(RECORD_SUFFIX)
    return int(stem) if len(parts) == 2 and len(stem) == 16 and is_decimal(stem) else None


def current_policy_key(store: Store, dataset: str) -> str | None:
    """The key of the dataset's current policy version (the one `stored_policy` reads), or None."""
    keys = _policy_keys(store, dataset)
    return keys[-1] if keys else None


def stored_policy(store: Store, dataset: str) -> Policy | None:
    """The dataset's policy as its last build recorded it, or None when none did."""
    key = current_policy_key(store, dataset)
    if key is None:
        return None
    source = f"{store.url}/{key}"
    if _generation(key) is None:  # a stray key sorting last: gc must not guess past it
        raise IntegrityError(f"{source}: not a retention policy version (its name is no 16-digit generation); "
                             "gc refuses to guess")
    try:
        data = canonical.loads(store.get_bytes(key))
        validate(data, POLICY_SCHEMA, source)
    except (ValueError, IntegrityError) as exc:
        raise IntegrityError(f"{source}: unreadable retention policy ({exc}); gc refuses to guess") from None
    if data["dataset"] != dataset:
        raise IntegrityError(f"{source}: the retention policy of {data['dataset']!r} filed under {dataset!r}")
    return Policy(data["keep_last"], data["keep_within_seconds"], "store")


def record_policy(store: Store, dataset: str, policy: Policy) -> None:
    """Record `policy` as the dataset's current one unless it already is (create-only versions:
    of two builds racing for one version one wins, and the other re-reads and retries)."""
    body = canonical.dumps(policy.to_json(dataset))
    for _ in range(MAX_RECORD_ATTEMPTS):
        versions = sorted((found, key) for key in _policy_keys(store, dataset) if (found := _generation(key)) is not None)
        if versions and store.get_bytes(versions[-1][1]) == body:
            return
        generation = versions[-1][0] + 1 if versions else 1
        if store.put_bytes(retention_key(dataset, generation), body):
            return
    raise IntegrityError(f"{store.url}: the retention policy of {dataset} kept changing; gave up recording it")


@dataclass(frozen=True)
class Kept:
    """One snapshot a rule keeps, and why (`by`: like "tiny@latest~2" or "hold: audit")."""

    rule: str
    snapshot: str
    dataset: str
    by: str

    def to_json(self) -> dict[str, str]:
        return {"snapshot": self.snapshot, "dataset": self.dataset, "by": self.by}


def datasets(store: Store) -> list[str]:
    """Every dataset with a ref or a history record."""
    found = {ref.dataset for ref in list_refs(store)}
    for info in store.list(HISTORY_PREFIX):
        dataset = info.key[len(HISTORY_PREFIX):].split("/", 1)[0]
        if not valid_name(dataset):  # fsck lists it as an invalid history record
            raise IntegrityError(f"{store.url}/{info.key}: malformed history record (its key names no dataset); "
                                 "gc refuses to guess")
        found.add(dataset)
    return sorted(found)


def _age(stamp: str, now: float) -> float:
    """Seconds since a ref time like 2026-01-01T00:00:00.000000Z."""
    moment = dt.datetime.strptime(stamp, TIME_FORMAT).replace(tzinfo=dt.UTC)
    return now - moment.timestamp()


def _history_rules(dataset: str, entries: list[Ref], policy: Policy, now: float) -> tuple[list[Kept], list[Kept]]:
    """keep_last and keep_within over one dataset's history (newest first): what they keep, and
    the generations they keep whose snapshot no record names (their history record is missing)."""
    by_name: dict[str, list[Ref]] = defaultdict(list)
    for entry in entries:
        by_name[entry.name].append(entry)
    kept: list[Kept] = []
    unknown: list[Kept] = []
    for name, generations in sorted(by_name.items()):
        generations.sort(key=lambda ref: ref.generation, reverse=True)
        newest = generations[0].generation
        for entry in generations:
            if entry.deleted:  # a tombstone (prep tag -d) names what the ref no longer names
                continue
            label = f"{dataset}@{name}~{newest - entry.generation}"
            if newest - entry.generation < policy.keep_last:
                kept.append(Kept("keep_last", entry.snapshot, dataset, label))
            if policy.keep_within and _age(entry.time, now) < policy.keep_within:
                kept.append(Kept("keep_within", entry.snapshot, dataset, f"{label} (moved {entry.time})"))
        for gap in _gaps(dataset, name, generations, policy, now):
            (kept if gap.snapshot else unknown).append(gap)
    return kept, unknown


def _gaps(dataset: str, name: str, generations: list[Ref], policy: Policy, now: float) -> list[Kept]:
    """The generations a rule keeps whose history record is missing (fail closed): each as the
    snapshot the next generation names as `previous`, or with no snapshot when that is missing too."""
    newest = generations[0].generation
    found: list[tuple[int, str, str]] = []  # (generation, snapshot or "" when unknown, why)
    for later, earlier in zip(generations, [*generations[1:], None]):  # newest first
        top, bottom = later.generation - 1, earlier.generation + 1 if earlier else 1
        within = bool(policy.keep_within) and _age(later.time, now) < policy.keep_within  # no missing one is later
        first = bottom if within else max(bottom, newest - policy.keep_last + 1)
        if first > top:
            continue
        if later.previous:
            found.append((top, later.previous, f"generation {later.generation} names it as previous"))
        if first < top or not later.previous:
            found.append((top - 1 if later.previous else top, "", "no record names its snapshot: every stored "
                          "snapshot kept"))
    return [Kept("keep_last" if newest - generation < policy.keep_last else "keep_within", snapshot, dataset,
                 f"{dataset}@{name}~{newest - generation} (its history record is missing; {why})")
            for generation, snapshot, why in found]


@dataclass(frozen=True)
class Override:
    """gc flags: each given one replaces that part of every dataset's policy (None: keep it)."""

    keep_last: int | None = None
    keep_within: int | None = None

    def apply(self, policy: Policy) -> Policy:
        """`policy` with the flags given replacing its parts; UsageError for a bad value."""
        if self.keep_last is None and self.keep_within is None:
            return policy
        return check_policy(policy.keep_last if self.keep_last is None else self.keep_last,
                            policy.keep_within if self.keep_within is None else self.keep_within, "flags")


def policies(store: Store, override: Override | None) -> dict[str, Policy]:
    """Each dataset's policy: what its build recorded (else the default), with gc's flags over it."""
    return {dataset: (override or Override()).apply(stored_policy(store, dataset) or Policy())
            for dataset in datasets(store)}


def retained(store: Store, chosen: dict[str, Policy], now: float) -> list[Kept]:
    """What the refs, keep_last and keep_within rules keep (holds come from `prep.store.holds`)."""
    kept = [Kept("refs", ref.snapshot, ref.dataset, f"{ref.dataset}@{ref.name}") for ref in list_refs(store)]
    unknown: list[Kept] = []
    for dataset, policy in chosen.items():
        named, gaps = _history_rules(dataset, ref_history(store, dataset), policy, now)
        kept.extend(named)
        unknown.extend(gaps)
    longest = max((policy.keep_within for policy in chosen.values()), default=0)
    if longest:  # a marker's dataset is unknown until its manifest is read: the longest duration applies
        kept.extend(Kept("keep_within", f"sha256:{marker_sha(info.key)}", "", "published within keep_within")
                    for info in store.list(SNAPSHOTS_PREFIX) if now - info.mtime < longest and is_marker_key(info.key))
    if unknown:  # a kept generation no record names could be any snapshot: keep them all rather than guess
        kept.extend(replace(unknown[0], snapshot=f"sha256:{marker_sha(info.key)}", dataset="")
                    for info in store.list(SNAPSHOTS_PREFIX) if is_marker_key(info.key))
    return kept


def snapshot_exists(store: Store, snapshot_id: str) -> bool:
    """True while the snapshot's manifest is stored; False once gc collected it (for `prep log`)."""
    return store.head(cas.object_key(hashing.parse_id(snapshot_id))) is not None
