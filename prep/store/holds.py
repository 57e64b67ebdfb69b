"""Holds: snapshots garbage collection must never collect (legal or audit holds).

A hold is a create-only record `layout.hold_key(snapshot)` (`prep.hold/1`); `prep release`
deletes it. A hold is placed under a build lease (leases.build_lease, not waiting: a running
gc makes it exit 2, try again), which no gc overlaps: the snapshot is checked and the hold
written while no gc can plan or delete, so a gc that runs later lists the hold.
"""

from __future__ import annotations

import datetime as dt
import getpass
from dataclasses import dataclass
from typing import Any

from prep.errors import IntegrityError, NotFoundError, StoreError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.storage.backend import Store
from prep.store.layout import HOLDS_PREFIX, RECORD_SUFFIX, hold_key, is_sha_hex
from prep.store.leases import build_lease
from prep.store.retention import snapshot_exists
from prep.store.snapshots import Snapshot

HOLD_SCHEMA = "prep.hold/1"


@dataclass(frozen=True)
class Hold:
    """One hold: the snapshot, its dataset, why, since when, by whom."""

    snapshot: str
    dataset: str
    reason: str
    time: str
    user: str | None = None

    def to_json(self) -> dict[str, Any]:
        body = {"schema": HOLD_SCHEMA, "snapshot": self.snapshot, "dataset": self.dataset, "reason": self.reason,
                "time": self.time}
        return body | ({"user": self.user} if self.user else {})

    @classmethod
    def from_json(cls, data: Any, source: str) -> Hold:
        """A validated hold; IntegrityError naming `source` when `data` breaks prep.hold/1."""
        validate(data, HOLD_SCHEMA, source)
        return cls(str(data["snapshot"]), str(data["dataset"]), str(data["reason"]), str(data["time"]),
                   data.get("user"))


def _user() -> str | None:
    """Who is placing the hold, when the system can tell."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def read_hold(store: Store, snapshot_id: str) -> Hold | None:
    """The hold on a snapshot, or None."""
    key = hold_key(snapshot_id)
    try:
        raw = store.get_bytes(key)
    except NotFoundError:
        return None
    source = f"{store.url}/{key}"
    try:
        data = canonical.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"{source}: unreadable hold record ({exc})") from None
    hold = Hold.from_json(data, source)
    if hold_key(hold.snapshot) != key:
        raise IntegrityError(f"{source}: the hold belongs at {hold_key(hold.snapshot)}")
    return hold


def scan_holds(store: Store) -> list[tuple[str, Hold | IntegrityError]]:
    """Every hold record by key, with its hold or why it does not read (fsck reports those)."""
    found: list[tuple[str, Hold | IntegrityError]] = []
    for info in store.list(HOLDS_PREFIX):
        if info.key.endswith(RECORD_SUFFIX):
            name = info.key[len(HOLDS_PREFIX):-len(RECORD_SUFFIX)]
            if not is_sha_hex(name):
                found.append((info.key, IntegrityError(f"{store.url}/{info.key}: not a hold record (its name is "
                                                       "no snapshot's SHA-256)")))
                continue
            try:
                hold = read_hold(store, "sha256:" + name)
            except IntegrityError as exc:
                found.append((info.key, exc))
                continue
            if hold is not None:
                found.append((info.key, hold))
    return found


def list_holds(store: Store) -> list[Hold]:
    """Every hold in the store, by snapshot id; an unreadable one is an IntegrityError (gc must not guess)."""
    holds = []
    for _, found in scan_holds(store):
        if isinstance(found, IntegrityError):
            raise found
        holds.append(found)
    return holds


def place_hold(store: Store, snapshot: Snapshot, reason: str) -> tuple[Hold, bool]:
    """Hold a stored snapshot; (the hold, True) when this call placed it, (the existing one, False)
    when it was already held. StoreError, holding nothing, while a gc runs (see the module doc)."""
    hold = Hold(snapshot.id, snapshot.dataset, reason, dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                _user())
    with build_lease(store, timeout=0):
        if not snapshot_exists(store, snapshot.id):
            raise NotFoundError(f"{store.url}: snapshot {snapshot.id} was collected before the hold was placed")
        if not store.put_bytes(hold_key(snapshot.id), canonical.dumps(hold.to_json())):
            existing = read_hold(store, snapshot.id)
            if existing is not None:
                return existing, False
            raise StoreError(f"{store.url}: the hold on {snapshot.id} was released while being placed; try again")
    return hold, True


def release_hold(store: Store, snapshot_id: str) -> Hold | IntegrityError:
    """Remove the hold on a snapshot, so gc may collect it again: the hold, or why its record did not
    read (an unreadable hold is removed too: gc refuses to run beside one); NotFoundError when none is held."""
    try:
        hold: Hold | IntegrityError | None = read_hold(store, snapshot_id)
    except IntegrityError as exc:
        hold = exc
    if hold is None:
        raise NotFoundError(f"{store.url}: snapshot {snapshot_id} is not held")
    store.delete(hold_key(snapshot_id))
    return hold
