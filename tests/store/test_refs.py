"""Refs by compare-and-swap with an expected generation, who moved what, tombstones, and the tag rules."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from prep.errors import IntegrityError, NotFoundError, RefConflictError, StaleRefError, StorageIOError, UsageError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.storage import LocalStore
from prep.store.layout import history_key, ref_key
from prep.store.refs import Mover, Ref, list_refs, move_ref, read_ref, read_ref_value, ref_history, update_ref
from prep.store.snapshots import resolve
from prep.store.tags import delete_tag, parse_expect, set_tag

A, B, C = (f"sha256:{digit * 64}" for digit in "abc")


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def stored(store: LocalStore, key: str) -> dict[str, object]:
    body: dict[str, object] = json.loads((store.root / key).read_bytes())
    return body


def test_expect_moves_only_from_that_generation_and_a_stale_one_leaves_the_ref(store: LocalStore) -> None:
    move_ref(store, "ds", "latest", A)
    with pytest.raises(StaleRefError, match="generation 1 .* not generation 2") as caught:
        move_ref(store, "ds", "latest", B, expect=2)
    assert caught.value.exit_code == 2
    with pytest.raises(StaleRefError, match="not absent"):
        move_ref(store, "ds", "latest", B, expect=0)
    ref = read_ref(store, "ds", "latest")
    assert ref is not None and (ref.snapshot, ref.generation) == (A, 1)
    assert not store.exists(history_key("ds", "latest", 2))
    assert move_ref(store, "ds", "latest", B, expect=1).generation == 2
    assert move_ref(store, "ds", "new", A, expect=0).generation == 1


def test_a_ref_naming_the_snapshot_already_is_left_as_it_is(store: LocalStore) -> None:
    first = move_ref(store, "ds", "latest", A)
    again = update_ref(store, "ds", "latest", A)
    assert not again.moved and again.ref == first
    assert [ref.generation for ref in ref_history(store, "ds")] == [1]


def test_racing_movers_with_one_expected_generation_move_the_ref_once(store: LocalStore) -> None:
    """Eight threads all expect generation 1: the swap lets exactly one win, the others stay stale."""
    move_ref(store, "ds", "latest", A)
    start = threading.Barrier(8)
    outcomes: list[str] = []

    def publish(index: int) -> None:
        start.wait()
        try:
            update_ref(store, "ds", "latest", f"sha256:{index:064x}", expect=1)
            outcomes.append("moved")
        except StaleRefError:
            outcomes.append("stale")

    threads = [threading.Thread(target=publish, args=(index + 1,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["moved"] + ["stale"] * 7
    history = ref_history(store, "ds")
    assert [ref.generation for ref in history] == [2, 1]
    assert read_ref(store, "ds", "latest") == history[0]


def test_every_value_records_who_moved_it_and_validates(store: LocalStore) -> None:
    move_ref(store, "ds", "v1", A, mover=Mover("tag", "alice", "node-7"))
    body = stored(store, ref_key("ds", "v1"))
    assert (body["user"], body["host"], body["command"]) == ("alice", "node-7", "tag")
    validate(body, "prep.ref/1")
    validate(stored(store, history_key("ds", "v1", 1)), "prep.ref/1")
    here = Mover.here("build")
    assert here.command == "build" and here.host


def test_values_written_before_the_who_fields_stay_readable(store: LocalStore) -> None:
    old = {"schema": "prep.ref/1", "dataset": "ds", "name": "latest", "snapshot": A, "generation": 1,
           "time": "2025-01-31T12:00:00.000000Z", "previous": None}
    validate(old, "prep.ref/1")
    assert store.swap_ref(ref_key("ds", "latest"), canonical.dumps(old), None)
    ref = read_ref(store, "ds", "latest")
    assert ref is not None and (ref.user, ref.host, ref.command, ref.deleted) == (None, None, None, False)
    assert Ref.from_json(old, "old").to_json() == old  # its bytes round-trip unchanged
    assert move_ref(store, "ds", "latest", B).previous == A


def test_a_deleted_tag_reads_as_absent_and_its_generations_go_on(store: LocalStore) -> None:
    set_tag(store, "ds", "v1", A)
    gone = delete_tag(store, "ds", "v1").ref
    assert gone.deleted and gone.generation == 2 and gone.snapshot == A
    assert read_ref(store, "ds", "v1") is None and list_refs(store, "ds") == []
    value = read_ref_value(store, "ds", "v1")
    assert value is not None and value.deleted
    validate(stored(store, history_key("ds", "v1", 2)), "prep.ref/1")
    assert [(ref.generation, ref.deleted) for ref in ref_history(store, "ds")] == [(2, True), (1, False)]
    with pytest.raises(NotFoundError):
        delete_tag(store, "ds", "v1")
    again = set_tag(store, "ds", "v1", B, expect=0)  # absent again: --expect none holds
    assert again.moved and again.ref.generation == 3 and not again.ref.deleted


def test_tags_stay_put_unless_forced(store: LocalStore) -> None:
    set_tag(store, "ds", "v2", A)
    with pytest.raises(RefConflictError, match="tags stay put") as caught:
        set_tag(store, "ds", "v2", B)
    assert caught.value.exit_code == 2
    assert read_ref(store, "ds", "v2") is not None and read_ref(store, "ds", "v2").snapshot == A  # type: ignore[union-attr]
    same = set_tag(store, "ds", "v2", A)
    assert not same.moved and same.ref.generation == 1
    forced = set_tag(store, "ds", "v2", B, force=True)
    assert forced.moved and (forced.ref.snapshot, forced.ref.generation, forced.ref.previous) == (B, 2, A)
    with pytest.raises(StaleRefError):
        set_tag(store, "ds", "v2", C, force=True, expect=1)


def test_proof_runs_only_when_the_rules_allow_a_move(store: LocalStore) -> None:
    proved: list[str] = []
    set_tag(store, "ds", "v3", A, prove=lambda: proved.append("A"))
    with pytest.raises(RefConflictError):
        set_tag(store, "ds", "v3", B, prove=lambda: proved.append("B"))
    set_tag(store, "ds", "v3", A, prove=lambda: proved.append("again"))
    assert proved == ["A"]


def test_latest_is_reserved_for_builds(store: LocalStore) -> None:
    with pytest.raises(UsageError, match="reserved"):
        set_tag(store, "ds", "latest", A)
    move_ref(store, "ds", "latest", A)
    with pytest.raises(UsageError, match="reserved"):
        delete_tag(store, "ds", "latest")
    assert read_ref(store, "ds", "latest") is not None


@pytest.mark.parametrize(("text", "generation"), [("0", 0), ("none", 0), ("NONE", 0), ("7", 7)])
def test_expect_accepts_a_generation_or_none(text: str, generation: int) -> None:
    assert parse_expect(text) == generation


@pytest.mark.parametrize("text", ["-1", "two", "1.5", "", "\u0663", "\uff13", "\u00b2"])
def test_expect_refuses_anything_else(text: str) -> None:
    with pytest.raises(UsageError, match="--expect"):
        parse_expect(text)


class HistoryFails(LocalStore):
    """A store whose history writes fail (a full disk right after the ref's swap)."""

    def put_bytes(self, key: str, data: bytes) -> bool:
        if key.startswith("history/"):
            raise StorageIOError("writing", key, "No space left on device", 28)
        return super().put_bytes(key, data)


def test_a_ref_that_moved_without_its_history_record_reports_a_move(tmp_path: Path) -> None:
    """The swap is the publish: a history record lost to a full disk after it does not turn the move
    into a failure, and the next move stores the missing record (ref_history lists it meanwhile)."""
    failing = HistoryFails(tmp_path / "store")
    move = update_ref(failing, "ds", "v1", A)
    assert move.moved and "No space left" in move.history_pending
    store = LocalStore(tmp_path / "store")
    assert [ref.generation for ref in ref_history(store, "ds")] == [1]
    move_ref(store, "ds", "v1", B)
    assert store.exists(history_key("ds", "v1", 1)) and store.exists(history_key("ds", "v1", 2))


@pytest.mark.parametrize(("body", "why"), [(b"garbage", "not JSON"), (b"", "not JSON"), (b"\xff\xfe", "not JSON"),
                                           (b"[1]", "a list, not an object"), (b'{"name": "x"}', "'dataset'")])
def test_a_damaged_ref_or_history_record_is_an_integrity_error_naming_it(store: LocalStore, body: bytes,
                                                                         why: str) -> None:
    """Regression: a ref file holding garbage or nothing (a foreign tool, a disk that lost it)
    escaped every command as a JSONDecodeError traceback."""
    snapshot = "sha256:" + "a" * 64
    move_ref(store, "web", "latest", snapshot)
    (store.root / ref_key("web", "latest")).write_bytes(body)
    for read in (lambda: read_ref(store, "web", "latest"), lambda: list_refs(store)):
        with pytest.raises(IntegrityError, match=f"refs/web/latest.json: malformed ref record .*{re.escape(why)}"):
            read()
    move_ref(store, "code", "latest", snapshot)
    (store.root / history_key("code", "latest", 1)).write_bytes(body)
    with pytest.raises(IntegrityError, match=f"history/code/latest/.*: malformed ref record .*{re.escape(why)}"):
        ref_history(store, "code")


@pytest.mark.parametrize(("field", "value", "why"), [
    ("generation", True, "generation True"), ("generation", 0, "generation 0"), ("generation", "1", "generation '1'"),
    ("snapshot", "garbage", "not a sha256 object id"), ("previous", "x", "not a sha256 object id"),
    ("dataset", 7, "dataset is a int"), ("name", "", "invalid ref name"), ("deleted", "yes", "deleted is 'yes'"),
])
def test_a_ref_value_of_the_wrong_type_is_malformed(store: LocalStore, field: str, value: object, why: str) -> None:
    """Regression: fields were converted, not checked: `generation: true` read as 1, a snapshot
    that is no object id reached callers (a ValueError traceback in prep diff and prep tag)."""
    move_ref(store, "web", "latest", A)
    body = {**stored(store, ref_key("web", "latest")), field: value}
    (store.root / ref_key("web", "latest")).write_bytes(canonical.dumps(body))
    with pytest.raises(IntegrityError, match=f"refs/web/latest.json: malformed ref record .*{re.escape(why)}"):
        read_ref(store, "web", "latest")


@pytest.mark.parametrize(("field", "value"), [("generation", 2), ("name", "other"), ("dataset", "elsewhere")])
def test_a_history_record_of_another_ref_or_generation_is_refused(store: LocalStore, field: str, value: object) -> None:
    """Regression: `web@latest~1` read whatever the record under that key said it was, even
    another generation, ref or dataset; `prep log` listed it as it claimed."""
    move_ref(store, "web", "latest", A)
    move_ref(store, "web", "latest", B)
    key = history_key("web", "latest", 1)
    (store.root / key).write_bytes(canonical.dumps({**stored(store, key), field: value}))
    for read in (lambda: resolve(store, "web@latest~1"), lambda: ref_history(store, "web")):
        with pytest.raises(IntegrityError, match="history/web/latest/0000000000000001.json: the record is of"):
            read()
