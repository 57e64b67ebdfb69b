"""Tags that stay put (docs/history.md, "Naming snapshots"): a tag names one snapshot until it is
deliberately moved (`--force`) or deleted; `latest` belongs to builds.

Every rule ends in one compare-and-swap of `prep.store.refs.update_ref`, with the generation the
rule checked as the expected one, so a tag created or moved meanwhile is never overwritten.
"""

from __future__ import annotations

from collections.abc import Callable

from prep.errors import NotFoundError, RefConflictError, UsageError
from prep.storage.backend import Store
from prep.store import leases
from prep.store.layout import is_decimal
from prep.store.refs import Mover, Ref, RefMove, check_name, read_ref, update_ref
from prep.store.retention import snapshot_exists

RESERVED = frozenset({"latest"})  # moved by every build of a dataset; a tag of that name would be overwritten


def check_tag_name(name: str) -> str:
    """`name` when it may be a tag; UsageError for an invalid or a reserved name."""
    check_name("tag", name)
    if name in RESERVED:
        raise UsageError(f"{name!r} is reserved: builds move DATASET@{name}; tag the snapshot with another name")
    return name


def tag_expectation(current: Ref | None, snapshot: str, *, force: bool, expect: int | None) -> int | None:
    """The live generation a move of a tag at `current` to `snapshot` must find (None: any).
    RefConflictError when the tag names another snapshot and `force` is not given."""
    if expect is not None:
        return expect
    if current is None:
        return 0  # create-only: a tag made meanwhile by someone else is theirs
    if current.snapshot == snapshot:
        return current.generation
    if not force:
        raise RefConflictError(f"{current.dataset}@{current.name} names {current.snapshot} (generation "
                               f"{current.generation}); tags stay put: use --force to move it")
    return current.generation


def set_tag(store: Store, dataset: str, name: str, snapshot: str, *, force: bool = False,
            expect: int | None = None, mover: Mover | None = None,
            prove: Callable[[], None] | None = None, on_wait: Callable[[str], None] | None = None) -> RefMove:
    """Point tag `dataset@name` at `snapshot` under the tag rules; re-tagging the same snapshot
    moves nothing. `prove` (the read-back, or a check that the snapshot is still stored) runs
    after the rules pass, before the swap.

    All of it holds a build lease (waiting while a gc runs): a gc that planned before the tag
    moved would otherwise delete the snapshot the new tag names, and `prove` then runs after
    any such gc, so it finds what that gc deleted. `on_wait` hears a running gc's lease key."""
    check_tag_name(name)
    with leases.build_lease(store, on_wait=on_wait):
        current = read_ref(store, dataset, name)
        if current is not None and current.snapshot == snapshot:
            return RefMove(current, False)
        wanted = tag_expectation(current, snapshot, force=force, expect=expect)
        if prove is not None:
            prove()
        return update_ref(store, dataset, name, snapshot, expect=wanted, mover=mover or Mover.here("tag"))


def still_stored(store: Store, snapshot: str) -> None:
    """The `prove` of a tag without read-back: NotFoundError when gc collected `snapshot` before the tag's lease."""
    if not snapshot_exists(store, snapshot):
        raise NotFoundError(f"{store.url}: snapshot {snapshot} was collected before the tag moved; nothing moved")


def parse_expect(text: str) -> int:
    """`--expect GEN`: a generation number, or 0 / "none" for a ref that must not exist (or was deleted)."""
    if text.lower() == "none":
        return 0
    if not is_decimal(text):
        raise UsageError(f"--expect {text!r}: give a generation number, or 0 or 'none' for a ref that must not exist")
    return int(text)


def delete_tag(store: Store, dataset: str, name: str, *, expect: int | None = None,
               mover: Mover | None = None) -> RefMove:
    """Delete tag `dataset@name`: a tombstone value (recorded in history) naming the snapshot it named."""
    check_tag_name(name)
    current = read_ref(store, dataset, name)
    if current is None:
        raise NotFoundError(f"{store.url}: no tag {dataset}@{name}")
    wanted = current.generation if expect is None else expect
    return update_ref(store, dataset, name, current.snapshot, expect=wanted, mover=mover or Mover.here("tag"),
                      delete=True)
