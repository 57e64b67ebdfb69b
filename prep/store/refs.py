"""Named refs (`dataset@name`) that point at published snapshots, moved by compare-and-swap.

A ref body carries a generation number that only grows. Every generation a ref takes is also
recorded create-only under `history/`, so no published generation is lost without trace even
when builders race for one ref. Each value records who set it (user, host, command); deleting a
tag swaps in a tombstone value, so generations keep growing and history keys never repeat.
"""

from __future__ import annotations

import datetime as dt
import getpass
import re
import socket
from dataclasses import dataclass

from prep import hashing
from prep.errors import IntegrityError, RefConflictError, StaleRefError, StoreError, UsageError
from prep.manifest import canonical
from prep.storage.backend import MAX_REF_BYTES, RefValue, Store
from prep.store.layout import HISTORY_PREFIX as HISTORY_PREFIX  # re-exported for callers of refs
from prep.store.layout import RECORD_SUFFIX, history_key, history_prefix, ref_key, refs_prefix
from prep.store.layout import check_name as check_name

MAX_SWAP_ATTEMPTS = 50
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # UTC, microseconds: 2026-01-31T12:00:00.000000Z
_TIME_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")


@dataclass(frozen=True)
class Mover:
    """Who moves a ref: the user and host of the process and the command (build or tag)."""

    command: str
    user: str | None = None
    host: str | None = None

    @classmethod
    def here(cls, command: str) -> Mover:
        """This process's user and host, moving refs for `command`."""
        try:
            user: str | None = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry and no $USER: a container's anonymous uid
            user = None
        return cls(command, user, socket.gethostname())


@dataclass(frozen=True)
class Ref:
    """One value of a ref: which snapshot it names, at which generation, since when, and who set it.
    A `deleted` value is a tombstone (`prep tag -d`): the ref reads as absent, its generations go on."""

    dataset: str
    name: str
    snapshot: str
    generation: int
    time: str
    previous: str | None = None
    user: str | None = None
    host: str | None = None
    command: str | None = None
    deleted: bool = False

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {
            "schema": "prep.ref/1",
            "dataset": self.dataset,
            "name": self.name,
            "snapshot": self.snapshot,
            "generation": self.generation,
            "time": self.time,
            "previous": self.previous,
        }
        # Optional fields only when set: values written before they existed keep their bytes.
        body.update({key: value for key, value in (("user", self.user), ("host", self.host),
                                                    ("command", self.command)) if value is not None})
        if self.deleted:
            body["deleted"] = True
        return body

    @classmethod
    def parse(cls, raw: bytes, source: str, key: str | None = None) -> Ref:
        """A ref value or history record from its stored bytes; anything else (garbage, an empty
        file, a record missing a field or of the wrong type), or a record that names another ref
        or generation than its `key` says, is an IntegrityError naming `source`."""
        try:
            data = canonical.loads(raw)
        except ValueError as exc:  # not JSON, or not UTF-8
            raise IntegrityError(f"{source}: malformed ref record (not JSON: {exc})") from None
        if not isinstance(data, dict):
            raise IntegrityError(f"{source}: malformed ref record (a {type(data).__name__}, not an object)")
        ref = cls.from_json(data, source)
        if key is not None and not ref.stored_at(key):
            raise IntegrityError(f"{source}: the record is of {ref.dataset}@{ref.name} generation {ref.generation}, "
                                 "not of the ref its key names")
        return ref

    @classmethod
    def from_json(cls, data: dict[str, object], source: str) -> Ref:
        """The value `data` spells, checked field by field as prep.ref/1 has them."""
        try:
            ref = cls(
                dataset=_text(data, "dataset"), name=_text(data, "name"), snapshot=_text(data, "snapshot"),
                generation=_generation_of(data), time=_time_of(data), previous=_optional(data, "previous"),
                user=_optional(data, "user"), host=_optional(data, "host"), command=_optional(data, "command"),
                deleted=_deleted(data),
            )
            check_name("dataset", ref.dataset)
            check_name("ref", ref.name)
            for object_id in (ref.snapshot, ref.previous):
                if object_id is not None:
                    hashing.parse_id(object_id)
            return ref
        except (KeyError, TypeError, ValueError, UsageError) as exc:
            raise IntegrityError(f"{source}: malformed ref record ({exc})") from None

    def stored_at(self, key: str) -> bool:
        """Whether this value belongs at `key`: its ref's current value, or its own history record."""
        return key in (ref_key(self.dataset, self.name), history_key(self.dataset, self.name, self.generation))

    @property
    def live(self) -> int:
        """The generation `--expect` compares with: this one, or 0 for a deleted ref."""
        return 0 if self.deleted else self.generation


def _text(data: dict[str, object], key: str) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is a {type(value).__name__}, not a string")
    return value


def _optional(data: dict[str, object], key: str) -> str | None:
    return None if data.get(key) is None else _text(data, key)


def _time_of(data: dict[str, object]) -> str:
    """The value's UTC time as prep.ref/1 spells it (retention computes ages from it)."""
    value = _text(data, "time")
    if not _TIME_SHAPE.fullmatch(value):
        raise ValueError(f"time {value!r} is not of the form 2026-01-31T12:00:00.000000Z")
    dt.datetime.strptime(value, TIME_FORMAT)  # ValueError: no such date or time of day
    return value


def _generation_of(data: dict[str, object]) -> int:
    value = data["generation"]
    if type(value) is not int or value < 1:  # bool is an int: `true` is no generation
        raise ValueError(f"generation {value!r} is not a whole number from 1")
    return value


def _deleted(data: dict[str, object]) -> bool:
    value = data.get("deleted", False)
    if value is not True and value is not False:
        raise ValueError(f"deleted is {value!r}, not true")
    return value


@dataclass(frozen=True)
class RefMove:
    """What `update_ref` did: the ref's value now, and whether this call changed it."""

    ref: Ref
    moved: bool
    history_pending: str = ""  # why the new generation's history record is not stored yet (the next move stores it)


def read_history_record(store: Store, key: str) -> Ref:
    """The ref value a history record at `key` holds, read within the bound of a ref value."""
    return Ref.parse(store.get_bytes(key, MAX_REF_BYTES), f"{store.url}/{key}", key)


def _read_value(store: Store, key: str) -> tuple[RefValue | None, Ref | None]:
    current = store.read_ref(key)
    return current, Ref.parse(current.body, f"{store.url}/{key}", key) if current else None


def read_ref(store: Store, dataset: str, name: str) -> Ref | None:
    """The live value of `dataset@name`, or None when it does not exist or was deleted."""
    ref = read_ref_value(store, dataset, name)
    return None if ref is None or ref.deleted else ref


def read_ref_value(store: Store, dataset: str, name: str) -> Ref | None:
    """The stored value of `dataset@name`, a tombstone included; None when it never existed."""
    return _read_value(store, ref_key(dataset, name))[1]


def _next_generation(store: Store, dataset: str, name: str, old: Ref | None) -> tuple[int, str | None]:
    """The generation a move of the ref from `old` takes, and the snapshot it replaces: one past
    `old`'s, unless history already holds that one (the ref was deleted, or set back to an older
    value, behind prep's back): then one past the newest history record, so that no generation
    is taken twice and its history record, create-only, is the value the ref really took."""
    if old is not None and not store.exists(history_key(dataset, name, old.generation + 1)):
        return old.generation + 1, old.snapshot
    keys = [info.key for info in store.list(f"{history_prefix(dataset)}{check_name('ref', name)}/")
            if info.key.endswith(RECORD_SUFFIX)]
    recorded = [read_history_record(store, key) for key in keys[-1:]]
    newest = max([ref.generation for ref in recorded] + [old.generation if old else 0])
    previous = old or (recorded[0] if recorded else None)
    return newest + 1, previous.snapshot if previous else None


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime(TIME_FORMAT)


def stale_ref(dataset: str, name: str, expect: int, old: Ref | None) -> StaleRefError:
    """The error for `dataset@name` found at `old` while the caller expected live generation `expect`."""
    now = f"generation {old.generation} ({old.snapshot})" if old and not old.deleted else "absent"
    if old is not None and old.deleted:
        now = f"deleted at generation {old.generation}"
    wanted = "absent" if expect == 0 else f"generation {expect}"
    return StaleRefError(f"{dataset}@{name} is {now}, not {wanted} as expected; left unmoved")


def update_ref(store: Store, dataset: str, name: str, snapshot: str, *, expect: int | None = None,
               mover: Mover | None = None, delete: bool = False) -> RefMove:
    """Point `dataset@name` at `snapshot` (or, with `delete`, leave a tombstone naming it) by
    compare-and-swap, retrying lost races. A ref that already names `snapshot` is left as it is.

    `expect` (None: any): the live generation the ref must be at, 0 for absent or deleted; the
    swap presents the token of the value that was checked, so no other move can slip in between.
    The caller must only pass snapshots whose manifest and artifacts are already stored."""
    key = ref_key(dataset, name)
    for _ in range(MAX_SWAP_ATTEMPTS):
        current, old = _read_value(store, key)
        if old is not None and old.snapshot == snapshot and old.deleted == delete:
            return RefMove(old, False)
        if expect is not None and (old.live if old else 0) != expect:
            raise stale_ref(dataset, name, expect, old)
        who = mover or Mover("api")
        generation, previous = _next_generation(store, dataset, name, old)
        new = Ref(dataset=dataset, name=name, snapshot=snapshot, generation=generation, time=_now(),
                  previous=previous, user=who.user, host=who.host, command=who.command, deleted=delete)
        body = canonical.dumps(new.to_json())
        if old is not None and current is not None:
            # Idempotent: records the generation we replace in case its own writer died first.
            store.put_bytes(history_key(dataset, name, old.generation), current.body)
        if store.swap_ref(key, body, current.token if current else None):
            try:
                # Create-only: a generation is won by exactly one swap, so this key is ours.
                store.put_bytes(history_key(dataset, name, new.generation), body)
            except StoreError as exc:  # the ref did move; the next move records this generation
                return RefMove(new, True, str(exc))
            return RefMove(new, True)
    raise RefConflictError(f"{dataset}@{name}: the ref kept moving; gave up after {MAX_SWAP_ATTEMPTS} attempts")


def move_ref(store: Store, dataset: str, name: str, snapshot: str, *, expect: int | None = None,
             mover: Mover | None = None) -> Ref:
    """Point `dataset@name` at `snapshot` (see `update_ref`); returns the ref's value now."""
    return update_ref(store, dataset, name, snapshot, expect=expect, mover=mover).ref


def list_refs(store: Store, dataset: str | None = None) -> list[Ref]:
    """Every ref in the store (or of one dataset), sorted by dataset and name."""
    refs = []
    for info in store.list(refs_prefix(dataset)):
        if not info.key.endswith(RECORD_SUFFIX):
            continue
        value = store.read_ref(info.key)
        if value is not None:
            ref = Ref.parse(value.body, f"{store.url}/{info.key}", info.key)
            if not ref.deleted:  # a tag deleted with `prep tag -d`: only its history remains
                refs.append(ref)
    return sorted(refs, key=lambda ref: (ref.dataset, ref.name))


def ref_history(store: Store, dataset: str) -> list[Ref]:
    """Every generation any ref of `dataset` has taken, newest first."""
    entries = []
    for info in store.list(history_prefix(dataset)):
        entries.append(read_history_record(store, info.key))
    # Refs that moved but crashed before their history record still count (tombstones too).
    seen = {(ref.name, ref.generation) for ref in entries}
    current = [_read_value(store, info.key)[1] for info in store.list(refs_prefix(dataset))
               if info.key.endswith(RECORD_SUFFIX)]
    entries.extend(ref for ref in current if ref is not None and (ref.name, ref.generation) not in seen)
    return sorted(entries, key=lambda ref: (ref.time, ref.generation, ref.name), reverse=True)
