"""Two processes at once on one local store: `prep tag` racing `prep gc`, and gc judging a build's
lease while the build renews it. Each test replays, deterministically, an interleaving that real
racing processes hit (a tag naming a snapshot gc then deleted; a gc running beside a build)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from prep import hashing
from prep.errors import NotFoundError, PrepError, StoreError
from prep.progress import Progress
from prep.storage import LocalStore
from prep.storage.backend import ObjectInfo, Store
from prep.store import cas, leases
from prep.store.fsck import fsck
from prep.store.gc import collect_garbage
from prep.store.holds import Hold, list_holds, place_hold
from prep.store.layout import HOLDS_PREFIX, leases_prefix
from prep.store.leases import BUILD, GC, Lease, live_leases
from prep.store.refs import read_ref
from prep.store.retention import Policy, record_policy
from prep.store.snapshots import Snapshot, resolve
from prep.store.tags import set_tag, still_stored
from tests.helpers import run_prep
from tests.runner.test_publish import build_in_process
from tests.store.test_gc import project, template  # noqa: F401 - fixtures: a store holding v1, and v2


def superseded(project: dict[str, Path]) -> tuple[LocalStore, Snapshot]:  # noqa: F811
    """The store once v2 moved tiny@latest on, and v1's snapshot: garbage now (keep_last 1)."""
    store = LocalStore(project["store"])
    old = resolve(store, "tiny@latest")
    build_in_process(project["v2"], store)
    return store, old


def test_a_gc_while_a_tag_moves_collects_nothing_the_tag_names(project: dict[str, Path]) -> None:  # noqa: F811
    store, old = superseded(project)
    refused: list[str] = []

    def gc_meanwhile() -> None:  # a `prep gc --grace 0s` between the tag's checks and its swap
        try:
            collect_garbage(store, grace_seconds=0)
        except StoreError as exc:
            refused.append(exc.message)

    moved = set_tag(store, "tiny", "keep", old.id, prove=gc_meanwhile)
    assert moved.moved and refused and "holds lease" in refused[0], "gc must stay out while a tag moves"
    assert cas.check(store, old.id) and fsck(store).clean


def test_a_tag_waits_for_a_running_gc_and_then_finds_what_it_collected(project: dict[str, Path],  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store, old = superseded(project)
    monkeypatch.setattr(leases, "WAIT_POLL_SECONDS", 0.02)
    outcome: list[PrepError] = []

    def tag() -> None:  # `prep tag --no-readback`, started while the gc runs
        try:
            set_tag(store, "tiny", "keep", old.id, prove=lambda: still_stored(store, old.id), on_wait=heard.append)
        except PrepError as exc:
            outcome.append(exc)

    heard: list[str] = []
    with Lease(store, GC) as gc:
        tagger = threading.Thread(target=tag)
        tagger.start()
        time.sleep(0.3)
        assert read_ref(store, "tiny", "keep") is None, "a tag must not move while a gc runs"
        store.delete(cas.object_key(hashing.parse_id(old.id)))  # the gc collects the old snapshot
    tagger.join(timeout=10)
    assert heard == [gc.key], "the wait is announced once, naming the gc's lease"
    assert len(outcome) == 1 and isinstance(outcome[0], NotFoundError), outcome
    assert read_ref(store, "tiny", "keep") is None


class RenewsWhileListing(Store):
    """Mixed into a store: its build lease is renewed right after gc lists it, before gc reads its body."""

    renewing: Lease | None = None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        found = list(super().list(prefix))  # type: ignore[safe-super]  # mixed in before a concrete store
        if self.renewing is not None and prefix == leases_prefix(BUILD):
            lease, self.renewing = self.renewing, None
            lease.seconds += 60  # a later expiry: the renewal writes a new key and deletes the listed one
            lease._write()
        yield from found


class RenewsWhileListed(RenewsWhileListing, LocalStore):
    """A local store whose build lease is renewed right after gc lists it."""


def test_a_build_lease_renewed_while_gc_looks_still_keeps_gc_out(tmp_path: Path) -> None:
    store = RenewsWhileListed(tmp_path / "store")
    orphan = cas.put_bytes(store, b"what the build will commit")
    with Lease(store, BUILD) as lease:
        store.renewing = lease
        with pytest.raises(StoreError, match="a build holds lease"):
            collect_garbage(store, grace_seconds=0)
        assert cas.check(store, orphan.id), "nothing is deleted while a build runs"
        store.renewing = lease
        assert [found.run for found in live_leases(store, BUILD)] == [lease.run]


def test_a_build_records_its_retention_policy_while_it_still_holds_its_lease(project: dict[str, Path],  # noqa: F811
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the policy was recorded after the build lease was let go, so a gc starting in
    that moment planned with the old policy (and with a zero grace could delete the policy's
    temporary file, failing a build that had published)."""
    from prep.runner import build as runner_build

    store = LocalStore(project["store"])
    held: list[bool] = []

    def watched(store: Store, dataset: str, policy: Policy) -> None:
        held.append(bool(live_leases(store, BUILD)))
        record_policy(store, dataset, policy)

    monkeypatch.setattr(runner_build, "record_policy", watched)
    build_in_process(project["v2"], store)
    assert held == [True]


def test_a_plain_fsck_beside_a_gc_warns_that_missing_objects_may_be_its_deletions(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: fsck run while a gc deleted reported objects as missing with nothing to say that
    a gc was the cause; it now names the gc lease it saw (the findings stay as found)."""
    store, old = superseded(project)
    assert fsck(store).gc_running is None
    with Lease(store, GC) as gc:
        store.delete(cas.object_key(hashing.parse_id(old.id)))  # the gc deleting meanwhile
        result = run_prep("fsck", "-q", "--store", project["store"], check=False)
    assert gc.key in result.stderr and "prep: warning: a gc ran during this check" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


class SecondHolderMeanwhile(LocalStore):
    """A store where, just after the first hold is written, a second `prep hold` of the same
    snapshot runs and then a gc starts (its lease live until the test ends it)."""

    snapshot: Snapshot | None = None
    gc: Lease | None = None
    second: tuple[Hold, bool] | None = None

    def put_bytes(self, key: str, data: bytes) -> bool:
        created = super().put_bytes(key, data)
        if key.startswith(HOLDS_PREFIX) and self.snapshot is not None:
            snapshot, self.snapshot = self.snapshot, None  # once
            with suppress(StoreError):
                self.second = place_hold(self, snapshot, "second")
            self.gc = Lease(self, GC).__enter__()
        return created


def test_a_hold_reported_as_already_held_is_still_held_when_both_return(project: dict[str, Path]) -> None:  # noqa: F811
    """Regression: two `prep hold` of one snapshot while a gc started: the second answered
    "already held", then the first saw the gc's lease and withdrew its hold, so nothing was held."""
    store = SecondHolderMeanwhile(project["store"])
    store.snapshot = snapshot = resolve(store, "tiny@latest")
    try:
        with suppress(StoreError):
            place_hold(store, snapshot, "first")
    finally:
        assert store.gc is not None
        store.gc.__exit__(None, None, None)
    assert store.second is not None and not store.second[1], "the second holder saw the first hold"
    assert [hold.reason for hold in list_holds(store)] == ["first"], "a hold someone was told of must exist"


def test_a_build_waiting_for_a_gc_says_so(project: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A build that met a running gc waited without a word: it looked hung."""
    monkeypatch.setattr(leases, "WAIT_POLL_SECONDS", 0.02)
    store, said = LocalStore(project["store"]), io.StringIO()
    gc = Lease(store, GC).__enter__()
    threading.Timer(0.3, gc.__exit__, (None, None, None)).start()
    build_in_process(project["v2"], store, progress=Progress(stream=said))
    assert f"waiting for garbage collection to finish ({gc.key})" in said.getvalue()
