"""What is a prep store: the init marker or any key of the layout; nothing else, locally or on S3,
and deciding it writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep.errors import StoreError
from prep.storage import LocalStore, open_store
from prep.store import cas, layout
from prep.store.marker import MARKER_KEY, is_store, mark, open_existing


def test_local_locations_that_are_not_stores(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "other" / "refsx").mkdir(parents=True)  # a name like a prefix is not the prefix
    (tmp_path / "other" / "refsx" / "a.json").write_text("{}")
    for name in ("absent", "empty", "file", "other", "file/below"):
        assert not is_store(LocalStore(tmp_path / name))
        with pytest.raises(StoreError, match=f"^{tmp_path / name} is not a prep store"):
            open_existing(tmp_path / name)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "empty", "file", "other", "other/refsx", "other/refsx/a.json"]


@pytest.mark.parametrize("key", [MARKER_KEY, "refs/d/latest.json", "snapshots/" + "a" * 64, "history/d/x.json",
                                 "tasks/tokenize/k.json", "stages/order/k.json", "logs/x.json", "leases/build",
                                 layout.pack_key("tokenize", "c" * 64, "d" * 64, "e" * 64),  # a killed build's only commit
                                 layout.object_key("b" * 64)])
def test_any_layout_key_or_the_marker_makes_a_store(tmp_path: Path, key: str) -> None:
    store = LocalStore(tmp_path / "store")
    store.put_bytes(key, b"x")
    assert is_store(store) and open_existing(tmp_path / "store").url == store.url


def test_mark_is_create_only(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    assert mark(store) and not mark(store) and is_store(store)


def test_s3_prefix_with_no_prep_keys_is_no_store(s3_bucket: str) -> None:
    url = f"{s3_bucket}/team/store"
    assert not is_store(open_store(url))
    neighbour = open_store(f"{s3_bucket}/team/store-old")  # shares the string prefix, not the folder
    cas.put_bytes(neighbour, b"an object of another store")
    open_store(f"{s3_bucket}/team").put_bytes("store/notes.txt", b"no prep key")
    with pytest.raises(StoreError, match="is not a prep store"):
        open_existing(url)
    assert [info.key for info in open_store(url).list("")] == ["notes.txt"]  # checking wrote nothing
    cas.put_bytes(open_store(url), b"first object")
    assert is_store(open_store(url))
