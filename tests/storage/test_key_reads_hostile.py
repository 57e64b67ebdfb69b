"""Hostile files at a local store's keys: a FIFO, a symlink to /dev/zero or a folder where a ref,
a history record or an object is read, and a body far over its bound, are each one IntegrityError
(exit 3) naming the key: never a read that blocks, nor one that runs until memory is gone."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from prep.errors import IntegrityError, NotFoundError
from prep.storage import LocalStore
from prep.storage.backend import MAX_BODY_BYTES, MAX_REF_BYTES
from prep.store.refs import read_history_record
from tests.helpers import within

REF, HISTORY, OBJECT = "refs/d/latest.json", "history/d/latest/0000000000000001.json", "objects/sha256/ab/cd"
PLANTS: dict[str, Callable[[Path], None]] = {
    "fifo": os.mkfifo, "/dev/zero": lambda path: path.symlink_to("/dev/zero"), "folder": Path.mkdir}


def planted(tmp_path: Path, plant: str) -> LocalStore:
    """A store whose ref, history record and object keys hold what `plant` names."""
    store = LocalStore(tmp_path / "store")
    for key in (REF, HISTORY, OBJECT):
        path = store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        PLANTS[plant](path)
    return store


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_every_read_of_a_key_refuses_anything_but_a_regular_file(tmp_path: Path, plant: str) -> None:
    """Regression: `read_ref` read with `Path.read_bytes()`: a FIFO at a ref blocked `prep ls`, `log`,
    `fsck`, `gc`, `show` and `build` for ever, a symlink to /dev/zero read until memory ran out."""
    store = planted(tmp_path, plant)
    reads: list[tuple[str, Callable[[], object]]] = [
        (REF, lambda: store.read_ref(REF)), (REF, lambda: store.swap_ref(REF, b"{}", None)),
        (HISTORY, lambda: read_history_record(store, HISTORY)), (OBJECT, lambda: store.get_bytes(OBJECT)),
        (OBJECT, lambda: store.open(OBJECT)), (OBJECT, lambda: store.get_range(OBJECT, 0, 10))]
    for key, read in reads:
        with within(10), pytest.raises(IntegrityError) as caught:
            read()
        assert caught.value.message == f"{store.url}/{key}: not a regular file, so not read"
        assert caught.value.exit_code == 3
    assert (store.root / REF).exists() or (store.root / REF).is_symlink(), "a refused swap leaves the key alone"


def test_a_body_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    """A ref or history record larger than any ref value, or any key read whole larger than
    MAX_BODY_BYTES, is refused by its size (sparse files here: reading them would take minutes)."""
    store = LocalStore(tmp_path / "store")
    for key, size in ((REF, MAX_REF_BYTES + 1), (HISTORY, 8 << 30), (OBJECT, MAX_BODY_BYTES + 1)):
        path = store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            out.truncate(size)
    reads: list[tuple[str, int, Callable[[], object]]] = [
        (REF, MAX_REF_BYTES, lambda: store.read_ref(REF)),
        (HISTORY, MAX_REF_BYTES, lambda: read_history_record(store, HISTORY)),
        (OBJECT, MAX_BODY_BYTES, lambda: store.get_bytes(OBJECT))]
    for key, limit, read in reads:
        with within(10), pytest.raises(IntegrityError) as caught:
            read()
        assert caught.value.message == (f"{store.url}/{key}: larger than {limit} bytes, more than such a key "
                                        "holds, so not read")
    os.truncate(store.root / REF, MAX_REF_BYTES)
    value = store.read_ref(REF)
    assert value is not None and value.body == bytes(MAX_REF_BYTES), "a body of exactly the bound is read"


def test_a_missing_key_is_still_not_found(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    assert store.read_ref(REF) is None
    with pytest.raises(NotFoundError, match="no such key"):
        store.get_bytes(OBJECT)
