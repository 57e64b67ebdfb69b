"""Races on one S3 bucket (moto's server): the interleavings of tests/store/test_concurrent_hostile.py
again through the S3 backend, where leases, holds and refs are objects written with conditional
PUTs, and gc or a lease holder meeting S3 errors part-way."""

from __future__ import annotations

import shutil
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from prep.errors import IntegrityError, NotFoundError, StoreError
from prep.storage import LocalStore
from prep.storage.s3 import S3Settings, S3Store
from prep.store import cas, leases, records
from prep.store.fsck import fsck
from prep.store.gc import collect_garbage
from prep.store.holds import list_holds, place_hold, release_hold
from prep.store.layout import leases_prefix, task_record_key
from prep.store.leases import BUILD, GC, Lease, read_leases
from prep.store.refs import read_ref
from prep.store.snapshots import Snapshot, resolve
from prep.store.tags import set_tag, still_stored
from tests.runner.test_publish import build_in_process
from tests.s3support import Fault, RequestHook
from tests.store.test_concurrent_hostile import RenewsWhileListing
from tests.store.test_gc import EMPTY_TOKENIZE, copy_to_s3, template  # noqa: F401 - fixture: a local store holding v1, and v2


@pytest.fixture(scope="module")
def both(template: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A local store where v2 moved tiny@latest on from v1 (v1's snapshot is garbage)."""
    root = tmp_path_factory.mktemp("s3hostile") / "store"
    shutil.copytree(template["store"], root, symlinks=True)
    build_in_process(template["v2"], LocalStore(root))
    return root


@pytest.fixture()
def superseded(both: Path, s3_bucket: str) -> tuple[S3Store, Snapshot]:
    """That store in a fresh bucket (tiny@latest = v2), and v1's snapshot, which no ref names."""
    store, _ = copy_to_s3(both, s3_bucket)
    assert isinstance(store, S3Store)
    return store, resolve(LocalStore(both), "tiny@latest~1")


def test_a_lease_renewed_while_gc_looks_still_keeps_gc_out_on_s3(s3_bucket: str) -> None:
    class RenewsWhileListed(RenewsWhileListing, S3Store):
        """An S3 store whose build lease is renewed right after gc lists it."""

    store = RenewsWhileListed(s3_bucket)
    orphan = cas.put_bytes(store, b"what the build will commit")
    with Lease(store, BUILD) as lease:
        store.renewing = lease
        with pytest.raises(StoreError, match="a build holds lease"):
            collect_garbage(store, grace_seconds=0)
    assert cas.check(store, orphan.id)


def test_a_gc_while_a_tag_moves_on_s3_collects_nothing_the_tag_names(
        superseded: tuple[S3Store, Snapshot]) -> None:
    store, old = superseded
    refused: list[str] = []

    def gc_meanwhile() -> None:
        try:
            collect_garbage(store, grace_seconds=0)
        except StoreError as exc:
            refused.append(exc.message)

    assert set_tag(store, "tiny", "keep", old.id, prove=gc_meanwhile).moved
    assert refused and "holds lease" in refused[0]
    assert cas.check(store, old.id)
    collect_garbage(store, grace_seconds=0)  # the tag now keeps it
    assert cas.check(store, old.id) and all(cas.check(store, f"sha256:{a['sha256']}") for a in old.artifacts)


def test_a_tag_on_s3_after_a_gc_collected_its_snapshot_moves_nothing(superseded: tuple[S3Store, Snapshot]) -> None:
    store, old = superseded
    collect_garbage(store, grace_seconds=0)
    with pytest.raises(NotFoundError, match="collected before the tag moved"):
        set_tag(store, "tiny", "keep", old.id, prove=lambda: still_stored(store, old.id))
    assert read_ref(store, "tiny", "keep") is None


def test_a_hold_on_s3_refuses_while_a_gc_runs_and_keeps_its_snapshot_after(
        superseded: tuple[S3Store, Snapshot]) -> None:
    store, old = superseded
    with Lease(store, GC), pytest.raises(StoreError, match="garbage collection is running"):
        place_hold(store, old, "audit")
    assert list_holds(store) == []
    hold, placed = place_hold(store, old, "audit")
    assert placed and not place_hold(store, old, "again")[1]
    collect_garbage(store, grace_seconds=0)
    assert cas.check(store, old.id) and [h.snapshot for h in list_holds(store)] == [old.id]


def test_holds_tags_and_gcs_racing_on_one_bucket_never_lose_what_they_keep(
        superseded: tuple[S3Store, Snapshot], monkeypatch: pytest.MonkeyPatch) -> None:
    """Real threads against one bucket: gcs with no grace, while a holder and a tagger keep
    trying to keep v1. Whatever the interleaving, whatever a hold or tag reported kept is whole."""
    store, old = superseded
    monkeypatch.setattr(leases, "WAIT_POLL_SECONDS", 0.01)
    kept: list[str] = []

    def gc() -> None:
        for _ in range(4):
            with suppress(StoreError):
                collect_garbage(store, grace_seconds=0)

    def keep() -> None:
        for _ in range(4):
            with suppress(StoreError):
                if place_hold(store, old, "race")[1]:
                    kept.append("hold")
                    release_hold(store, old.id)
        with suppress(StoreError):
            if set_tag(store, "tiny", "keep", old.id, prove=lambda: still_stored(store, old.id)).moved:
                kept.append("tag")

    threads = [threading.Thread(target=gc), threading.Thread(target=gc), threading.Thread(target=keep)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    collect_garbage(store, grace_seconds=0)
    tag = read_ref(store, "tiny", "keep")
    assert (tag is not None) == ("tag" in kept)
    if tag is not None:
        assert cas.check(store, old.id) and all(cas.check(store, f"sha256:{a['sha256']}") for a in old.artifacts)
    assert fsck(store).clean and read_leases(store) == []


def test_a_gc_whose_deletes_keep_failing_stops_before_any_object_a_record_names(
        superseded: tuple[S3Store, Snapshot], s3_request_hooks: list[RequestHook]) -> None:
    """S3 answering 500 to every DELETE of one garbage record: gc stops with one line, having
    deleted no object (objects go last), and lets go of its lease."""
    store, old = superseded
    store = S3Store(store.url, S3Settings(max_attempts=2))
    orphan = cas.put_bytes(store, b"an intermediate of an abandoned build")
    records.write_task_record(store, "tokenize", "e" * 64, {"intermediate": orphan.id}, EMPTY_TOKENIZE)
    victim = task_record_key("tokenize", "e" * 64)
    path = f"/{store.bucket}/{store.prefix}{victim}"

    def refuse(environ: dict[str, Any]) -> Fault | None:
        return Fault(500, "InternalError") if environ["REQUEST_METHOD"] == "DELETE" and \
            environ["PATH_INFO"] == path else None

    s3_request_hooks.append(refuse)
    before = {info.key for info in store.list("objects/")}
    with pytest.raises(StoreError, match="InternalError") as caught:
        collect_garbage(store, grace_seconds=0)
    assert "\n" not in str(caught.value)
    assert {info.key for info in store.list("objects/")} == before and store.exists(victim)
    assert read_leases(store) == []
    s3_request_hooks.clear()
    collect_garbage(store, grace_seconds=0)
    assert not store.exists(victim) and not store.exists(cas.object_key(orphan.sha256))


def test_a_lease_that_cannot_be_released_after_a_failure_leaves_that_failure_to_be_reported(
        s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    """Regression: when the work under a lease failed (exit 3) and S3 then also refused the
    lease's DELETE, the release's StoreError (exit 2) replaced the failure; the lease lapses by
    itself, and the caller hears what ended the work."""
    store = S3Store(s3_bucket, S3Settings(max_attempts=1))

    def refuse(environ: dict[str, Any]) -> Fault | None:
        deleting = environ["REQUEST_METHOD"] == "DELETE" and f"/{leases_prefix()}" in environ["PATH_INFO"]
        return Fault(503, "SlowDown") if deleting else None

    s3_request_hooks.append(refuse)
    with pytest.raises(IntegrityError, match="what ended the work"), Lease(store, BUILD):
        raise IntegrityError("what ended the work")
    with pytest.raises(StoreError, match="SlowDown"), Lease(store, BUILD):
        pass  # nothing failed before: a lease left behind is worth saying
    assert len(read_leases(store)) == 2
