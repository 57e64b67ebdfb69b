"""The record of object files proven by hashing: stamps, damage, compaction."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from prep.storage import LocalStore
from prep.store import cas, proven
from prep.store.layout import PROVEN_KEY
from tests.runner.test_disk_full import fill_up, small_tmpfs


def _stored(store: LocalStore, tmp_path: Path, data: bytes) -> str:
    source = tmp_path / f"in-{len(data)}"
    source.write_bytes(data)
    return cas.put_file(store, source).id


def test_an_unchanged_file_is_known_and_any_change_to_it_is_not(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    kept, touched = _stored(store, tmp_path, b"a" * 100), _stored(store, tmp_path, b"b" * 200)
    stamps = {object_id: cas.file_stamp(store, object_id) for object_id in (kept, touched)}
    proven.record(store, {object_id: stamp for object_id, stamp in stamps.items() if stamp is not None})
    path = store.local_path(cas.object_key(touched.removeprefix("sha256:")))
    assert path is not None
    os.utime(path)  # nothing written, but the file's stamp moved
    assert proven.unchanged(store, [kept, touched, "sha256:" + "0" * 64], proven.load(store)) == {kept}


def test_the_record_is_compacted_when_loaded_after_it_grew(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    object_id = _stored(store, tmp_path, b"x" * 10)
    stamp = cas.file_stamp(store, object_id)
    assert stamp is not None
    for _ in range(40):
        proven.record(store, {object_id: stamp})
    assert proven.load(store) == {object_id: stamp}  # compacts
    lines = (tmp_path / "store" / PROVEN_KEY).read_bytes().splitlines()
    assert len(lines) <= proven.COMPACT_FACTOR + 1
    assert proven.load(store) == {object_id: stamp}


def test_the_record_lives_outside_every_prefix_a_listing_gc_or_scrub_reads(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    object_id = _stored(store, tmp_path, b"y" * 10)
    stamp = cas.file_stamp(store, object_id)
    assert stamp is not None
    proven.record(store, {object_id: stamp})
    from prep.store import layout

    prefixes = [value for name, value in vars(layout).items() if name.endswith("_PREFIX")]
    assert prefixes and not any(PROVEN_KEY.startswith(prefix) for prefix in prefixes)


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    first, second = _stored(store, tmp_path, b"1" * 10), _stored(store, tmp_path, b"2" * 20)
    stamps = {object_id: cas.file_stamp(store, object_id) for object_id in (first, second)}
    assert all(stamp is not None for stamp in stamps.values())
    proven.record(store, {first: stamps[first]})  # type: ignore[dict-item]
    path = tmp_path / "store" / PROVEN_KEY
    path.write_bytes(path.read_bytes()[:-20])  # a build killed while appending
    proven.record(store, {second: stamps[second]})  # type: ignore[dict-item]
    assert proven.load(store) == {second: stamps[second]}


def _stamps(store: LocalStore, tmp_path: Path, count: int, start: int = 0) -> dict[str, cas.FileStamp]:
    found = {}
    for index in range(start, start + count):
        object_id = _stored(store, tmp_path, str(index).encode() * 3)
        stamp = cas.file_stamp(store, object_id)
        assert stamp is not None
        found[object_id] = stamp
    return found


def _append_many(root: str, stamps: dict[str, tuple[int, ...]], rounds: int) -> None:
    """One of several processes appending to one record at once."""
    store = LocalStore(Path(root))
    for _ in range(rounds):
        proven.record(store, {object_id: cas.FileStamp(*stamp) for object_id, stamp in stamps.items()})


def test_builds_appending_at_once_lose_no_line(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    groups = [_stamps(store, tmp_path, 300, start=300 * group) for group in range(4)]
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_many, args=(str(tmp_path / "store"), group, 20)) for group in groups]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    # Whole lines, none interleaved or torn (an empty one where a writer saw another's write
    # half done and took it for a torn line is harmless).
    lines = [line for line in (tmp_path / "store" / PROVEN_KEY).read_bytes().splitlines() if line]
    assert len(lines) == 4 * 20 * 300 and all(proven._parse(line) is not None for line in lines)
    assert proven.load(store) == {object_id: stamp for group in groups for object_id, stamp in group.items()}


def test_a_full_disk_leaves_the_record_readable_and_no_temporary(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "1m") as mount:
        store = LocalStore(mount / "store")
        kept = _stamps(store, tmp_path, 20)
        for _ in range(3 * proven.COMPACT_FACTOR):
            proven.record(store, kept)
        fill_up(mount)
        extra = _stamps(LocalStore(tmp_path / "other"), tmp_path, 2000, start=20)
        proven.record(store, extra)  # a part fits, ending in a torn line
        loaded = proven.load(store)  # its compaction does not fit: the record stays as it was
        assert kept.items() <= loaded.items() and loaded.items() <= (kept | extra).items()
        assert sorted(path.name for path in (mount / "store" / "proven").iterdir()) == ["objects.jsonl"]


def test_a_temporary_left_by_a_killed_compaction_is_removed_by_the_next(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    kept = _stamps(store, tmp_path, 3)
    folder = tmp_path / "store" / "proven"
    for _ in range(proven.COMPACT_FACTOR + 1):
        proven.record(store, kept)
    (folder / "objects.jsonl.99999.tmp").write_bytes(b"half a reco")
    assert proven.load(store) == kept
    assert sorted(path.name for path in folder.iterdir()) == ["objects.jsonl"]
