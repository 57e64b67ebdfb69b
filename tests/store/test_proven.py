"""The record of object files proven by hashing: stamps, damage, compaction."""

from __future__ import annotations

import os
from pathlib import Path

from prep.storage import LocalStore
from prep.store import cas, proven
from prep.store.layout import PROVEN_KEY


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
