"""Leases, refs, retention records and keys of an S3 store (moto's server) changed behind prep's
back, as any other S3 client could: gc, builds and tags must refuse, or pass over what is not
prep's, in one line, and never take a damaged record for a good one. Races: test_s3_races.py."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import pytest

from prep.errors import IntegrityError, StaleRefError, StoreError
from prep.storage.s3 import S3Store
from prep.store import cas
from prep.store.gc import collect_garbage
from prep.store.layout import history_key, lease_key, leases_prefix, ref_key, retention_key
from prep.store.leases import (
    BUILD,
    GC,
    MAX_LEASE_SECONDS,
    RENEWAL_SLACK_SECONDS,
    Lease,
    live_leases,
    process_scope,
    read_leases,
)
from prep.store.refs import move_ref, read_ref, ref_history
from prep.store.retention import Override, Policy, record_policy, stored_policy
from prep.store.tags import set_tag
from tests.helpers import run_prep
from tests.s3support import RequestHook, admin_client


def plant(store: S3Store, key: str, body: bytes) -> None:
    """Write `key` behind prep's back (no condition, as any other S3 client could)."""
    admin_client().put_object(Bucket=store.bucket, Key=store.prefix + key, Body=body)


def unplant(store: S3Store, key: str) -> None:
    admin_client().delete_object(Bucket=store.bucket, Key=store.prefix + key)


def fake_id(label: str) -> str:
    """A snapshot id for refs that are only moved, never resolved."""
    return f"sha256:{hashlib.sha256(label.encode()).hexdigest()}"


def live_build_lease(store: S3Store, body: bytes) -> str:
    key = lease_key(BUILD, "20260101T000000Z-planted", int(time.time()) + 600)
    plant(store, key, body)
    return key


# ------------------------------------------------------------------ lease objects changed behind prep's back


ODD_BODIES = [b"[]", b"7", b'"held"', b"null", b"", b"{", b"\xff\xfe", b'{"scope": "SCOPE", "pid": 1e400}',
              b'{"scope": "SCOPE", "pid": 100000000000000000000000000000}', b'{"scope": "SCOPE", "pid": -1}',
              b'{"scope": "SCOPE", "pid": true}']


@pytest.mark.parametrize("body", ODD_BODIES)
def test_a_live_lease_whose_body_is_no_lease_object_still_keeps_gc_out(s3_bucket: str, body: bytes) -> None:
    """Regression: a lease body that was JSON but no object (`[]`, `7`, `null`) crashed every gc and
    build with AttributeError, and a pid too large for the OS with OverflowError; a body that cannot
    be judged means a holder that may be alive: the lease is held."""
    store = S3Store(s3_bucket)
    key = live_build_lease(store, body.replace(b"SCOPE", (process_scope() or "").encode()))
    assert [lease.key for lease in live_leases(store, BUILD)] == [key]
    with pytest.raises(StoreError, match="a build holds lease"):
        collect_garbage(store, grace_seconds=0)
    assert store.exists(key)


def test_prep_gc_beside_a_lease_of_the_wrong_shape_is_one_line(s3_bucket: str) -> None:
    """The same through the CLI: one error line naming the lease, exit 2, no traceback."""
    store = S3Store(s3_bucket)
    key = live_build_lease(store, b"[1, 2]")
    plant(store, "prep-store.json", b"{}")  # let the CLI open the prefix as a store
    result = run_prep("gc", "--store", s3_bucket, "--grace", "0s", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("prep: error: ") and key in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("name", ["\u00b2", "\u0663\u0663", "12a", ""])
def test_a_lease_key_named_with_other_digits_is_no_lease(s3_bucket: str, name: str) -> None:
    """Regression: `leases/build/<run>/².json` (str.isdigit takes '²', int() does not) crashed every
    build and gc with ValueError; such a key is no lease, and gc deletes it once past the grace."""
    store = S3Store(s3_bucket)
    key = f"{leases_prefix(BUILD)}run/{name}.json"
    plant(store, key, b"{}")
    assert read_leases(store) == [] and live_leases(store, BUILD) == []
    with Lease(store, BUILD) as lease:
        assert [found.key for found in live_leases(store, BUILD)] == [lease.key]
    report = collect_garbage(store, grace_seconds=0)
    assert report.deleted["leases"].count == 1 and not store.exists(key)


@pytest.mark.skipif(process_scope() is None, reason="no pid scope here: no lease is judged by its pid")
def test_expired_and_abandoned_leases_on_s3(s3_bucket: str) -> None:
    """A lease past its expiry, and one of a process of this machine that is gone, keep nobody out."""
    store = S3Store(s3_bucket)
    plant(store, lease_key(BUILD, "old", int(time.time()) - 5), b"{}")
    dead = json.dumps({"scope": process_scope(), "pid": 2**22 + 1}).encode()  # above Linux's pid_max
    plant(store, lease_key(BUILD, "dead", int(time.time()) + 600), dead)
    assert live_leases(store, BUILD) == []
    assert collect_garbage(store, grace_seconds=0).deleted["leases"].count == 2
    assert read_leases(store) == []


def test_a_far_dated_lease_on_s3_is_judged_by_the_stores_clock(s3_bucket: str) -> None:
    """A lease key dated years ahead keeps gc out while the store wrote it within a lifetime, and
    not once the store's clock (read from our own lease key's stamp) is a lifetime past it."""
    store = S3Store(s3_bucket)
    far = int(time.time()) + 10 * 365 * 86400
    plant(store, lease_key(BUILD, "ahead", far), json.dumps({"pid": 1, "scope": "elsewhere"}).encode())
    with Lease(store, GC) as lease:
        store_now = lease.store_now()
        assert store_now is not None and abs(store_now - time.time()) < 60
        assert [found.run for found in live_leases(store, BUILD, store_now=store_now)] == ["ahead"]
        later = store_now + MAX_LEASE_SECONDS + RENEWAL_SLACK_SECONDS + 1
        assert live_leases(store, BUILD, store_now=later) == []
    with pytest.raises(StoreError, match="a build holds lease"):
        collect_garbage(store, grace_seconds=0)


# --------------------------------------------------------------------------- retention records


def test_a_stray_retention_key_neither_crashes_a_build_nor_lets_gc_guess(s3_bucket: str) -> None:
    """Regression: a key like `retention/tiny/notes.json` sorting after the versions made every
    build that recorded the policy die with ValueError (int('notes')). The build now records the
    next real version; gc (and fsck) still refuse the stray as the current policy, as for holds."""
    store = S3Store(s3_bucket)
    record_policy(store, "tiny", Policy(3, 0))
    plant(store, "retention/tiny/notes.json", b"{}")
    plant(store, "retention/tiny/sub/0000000000000009.json", b"{}")
    record_policy(store, "tiny", Policy(2, 0))
    assert store.exists(retention_key("tiny", 2)) and not store.exists(retention_key("tiny", 10))
    with pytest.raises(IntegrityError, match="sub/0000000000000009.json: not a retention policy version"):
        stored_policy(store, "tiny")
    unplant(store, "retention/tiny/notes.json")
    unplant(store, "retention/tiny/sub/0000000000000009.json")
    assert stored_policy(store, "tiny") == Policy(2, 0, "store")


# ---------------------------------------------------------------------------- refs behind prep's back


@pytest.mark.parametrize("stamp", ["yesterday", "2026-01-01T00:00:00Z", "2026-13-01T00:00:00.000000Z", ""])
def test_a_ref_whose_time_is_no_time_is_a_malformed_record(s3_bucket: str, stamp: str) -> None:
    """Regression: a ref or history value with a `time` that is no prep.ref/1 time passed as a
    ref, and gc with keep_within died on it with a ValueError traceback (strptime)."""
    store = S3Store(s3_bucket)
    snapshot = fake_id("a")
    body = {"schema": "prep.ref/1", "dataset": "tiny", "name": "latest", "snapshot": snapshot,
            "generation": 1, "time": stamp, "previous": None}
    plant(store, history_key("tiny", "latest", 1), json.dumps(body).encode())
    with pytest.raises(IntegrityError, match="malformed ref record"):
        ref_history(store, "tiny")
    with pytest.raises(IntegrityError, match="malformed ref record"):
        collect_garbage(store, grace_seconds=0, dry_run=True, policy=Override(keep_within=3600))


@pytest.mark.parametrize("dataset", ["we b", "-x", "\u00e9t\u00e9"])
def test_a_history_key_of_no_dataset_makes_gc_refuse_as_for_any_bad_record(s3_bucket: str, dataset: str) -> None:
    """Regression: a stray `history/we b/...` made gc fail as a usage error (exit 2, "invalid
    dataset name") though nobody typed that name; it is a damaged store (exit 3), as fsck says."""
    store = S3Store(s3_bucket)
    plant(store, f"history/{dataset}/latest/0000000000000001.json", b"{}")
    with pytest.raises(IntegrityError, match="malformed history record .its key names no dataset"):
        collect_garbage(store, grace_seconds=0, dry_run=True)


def test_a_ref_deleted_behind_preps_back_continues_its_generations(s3_bucket: str) -> None:
    """Regression: a ref object deleted by hand (or by a lifecycle rule) restarted at generation 1;
    its history records then silently kept the old life's values (create-only), so `latest~1`
    named a snapshot of the old life and keep_last kept the wrong ones. Generations now go on."""
    store = S3Store(s3_bucket)
    for label in "abc":
        move_ref(store, "tiny", "latest", fake_id(label))
    unplant(store, ref_key("tiny", "latest"))
    moved = move_ref(store, "tiny", "latest", fake_id("d"))
    assert (moved.generation, moved.previous) == (4, fake_id("c"))
    move_ref(store, "tiny", "latest", fake_id("e"))
    history = {ref.generation: ref.snapshot for ref in ref_history(store, "tiny")}
    assert history == {1: fake_id("a"), 2: fake_id("b"), 3: fake_id("c"), 4: fake_id("d"), 5: fake_id("e")}


def test_a_ref_set_back_to_an_older_value_behind_preps_back_moves_on_past_its_history(s3_bucket: str) -> None:
    """Regression: a ref restored to an older value (an earlier object version brought back in a
    versioned bucket) moved on to a generation history already held; the create-only history
    write then failed without a word, so history named another snapshot than the ref had."""
    store = S3Store(s3_bucket)
    for label in "abc":
        move_ref(store, "tiny", "latest", fake_id(label))
    plant(store, ref_key("tiny", "latest"), store.get_bytes(history_key("tiny", "latest", 2)))
    moved = move_ref(store, "tiny", "latest", fake_id("d"))
    assert (moved.generation, moved.previous) == (4, fake_id("b"))
    history = {ref.generation: ref.snapshot for ref in ref_history(store, "tiny")}
    assert history == {1: fake_id("a"), 2: fake_id("b"), 3: fake_id("c"), 4: fake_id("d")}


def test_a_tag_swap_that_loses_to_a_write_behind_its_back_never_clobbers_it(s3_bucket: str) -> None:
    """If-Match on S3: a ref replaced meanwhile by another writer (a new ETag) fails the swap (412);
    the re-read finds the tag past the generation the rules checked, and the other value stays."""
    store = S3Store(s3_bucket)
    move_ref(store, "tiny", "keep", fake_id("a"))
    theirs = read_ref(store, "tiny", "keep")
    assert theirs is not None
    real_swap = store.swap_ref

    def swap_after_another_writer(key: str, body: bytes, expected: str | None) -> bool:
        other = json.loads(body) | {"snapshot": fake_id("theirs")}
        plant(store, key, json.dumps(other, sort_keys=True, separators=(",", ":")).encode())
        store.swap_ref = real_swap  # type: ignore[method-assign]
        return real_swap(key, body, expected)

    store.swap_ref = swap_after_another_writer  # type: ignore[method-assign]
    with pytest.raises(StaleRefError, match="not generation 1 as expected; left unmoved"):
        set_tag(store, "tiny", "keep", fake_id("b"), force=False, expect=theirs.generation)
    now = read_ref(store, "tiny", "keep")
    assert now is not None and now.snapshot == fake_id("theirs")


# ------------------------------------------------------------------------------- odd keys


def test_a_key_no_request_may_name_is_not_listed_and_does_not_stop_gc(s3_bucket: str) -> None:
    """Regression: a stray `snapshots/..` (any key with a `..` segment, which the backend refuses to
    send in a request) was listed, and gc died deleting it, every run; such keys are not listed."""
    store = S3Store(s3_bucket)
    for key in ("snapshots/..", "leases/build/../x.json", "objects/sha256/../../refs"):
        plant(store, key, b"")
    kept = cas.put_bytes(store, b"an orphan")
    assert [info.key for info in store.list("")] == [cas.object_key(kept.sha256)]
    assert collect_garbage(store, grace_seconds=0).deleted["objects"].count == 1


def test_gc_pages_through_a_listing_of_many_pages(s3_bucket: str, s3_request_hooks: list[RequestHook]) -> None:
    """ListObjectsV2 answers at most 1000 keys a page; the server here answers 3, so every
    listing gc makes runs over many pages (continuation tokens) and must miss nothing."""
    pages: list[str] = []

    def three_a_page(environ: dict[str, Any]) -> None:
        if environ["REQUEST_METHOD"] == "GET" and "list-type=2" in environ.get("QUERY_STRING", ""):
            environ["QUERY_STRING"] += "&max-keys=3"
            pages.append(environ["QUERY_STRING"])

    store = S3Store(s3_bucket)
    for index in range(10):
        plant(store, f"leases/build/r{index}/000000000001.json", b"{}")  # long expired
        cas.put_bytes(store, f"orphan {index}".encode())
    s3_request_hooks.append(three_a_page)
    assert len(list(store.list(""))) == 20 and len(pages) == 7
    report = collect_garbage(store, grace_seconds=0)
    assert (report.deleted["leases"].count, report.deleted["objects"].count) == (10, 10)
    assert list(store.list("")) == []
