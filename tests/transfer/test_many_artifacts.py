"""What keeps pull and verify fast at 100,000 artifacts stays correct: the fast manifest check
never accepts what jsonschema refuses, the per-folder path resolution equals `realpath`, the
worker pool keeps order and errors, and a no-op pull reads no file."""

from __future__ import annotations

import copy
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import InputError
from prep.manifest.schema import _validator, conforms
from prep.storage.local import LocalStore
from prep.transfer.paths import Resolver
from prep.transfer.pull import pull
from prep.transfer.shares import Artifact, artifacts_of, check_paths, partition
from prep.transfer.verify import run_parallel, verify
from tests.manifest.jsonmutation import mutated
from tests.snapshot_factory import build_snapshot, many_artifacts

SCHEMA = "prep.snapshot/1"


@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("manifest")
    return build_snapshot(LocalStore(root / "store"), root / "work", shard_sizes=(900, 500)).snapshot.manifest


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_fast_check_accepts_nothing_jsonschema_refuses(manifest: dict[str, Any], data: st.DataObject) -> None:
    assert conforms(manifest, SCHEMA)  # the fast path works for real manifests, or big ones are slow again
    broken = mutated(manifest, data)
    if conforms(broken, SCHEMA):
        assert not list(_validator(SCHEMA).iter_errors(broken))


@pytest.mark.parametrize(("where", "value"), [
    (("artifacts", 0, "path"), ""), (("artifacts", 1, "size"), -1), (("artifacts", 1, "shard"), True),
    (("artifacts", 2, "sha256"), "0" * 63), (("artifacts", 2, "format"), "Tar"), (("artifacts", 0, "tokens"), 1.5),
    (("artifacts", 0, "surprise"), 1), (("inputs", "version"), "sha256:" + "A" * 64), (("schema",), "prep.snapshot/2"),
    (("stats", "extra_count"), -5), (("tokenizer", "encode_special_tokens"), 0), (("artifacts",), {}),
    (("config",), []), (("seed",), None),
])
def test_the_fast_check_refuses_each_kind_of_violation(manifest: dict[str, Any], where: tuple[Any, ...],
                                                        value: Any) -> None:
    broken = copy.deepcopy(manifest)
    parent = broken
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = value
    assert list(_validator(SCHEMA).iter_errors(broken))
    assert not conforms(broken, SCHEMA)
    for key in ("artifacts", "stats", "dataset"):
        assert not conforms({k: v for k, v in manifest.items() if k != key}, SCHEMA)


def test_folder_wise_resolution_equals_realpath(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    for folder in (dest / "bin", dest / "real/inner", outside):
        folder.mkdir(parents=True)
    (dest / "wds").symlink_to("real")
    (dest / "away").symlink_to(outside)
    (dest / "bin/link.bin").symlink_to("../real/inner")
    (dest / "bin/out.bin").symlink_to(outside / "x")
    (dest / "bin/loop").symlink_to("loop")
    (dest / "file").write_bytes(b"")
    paths = ["bin/a.bin", "bin/link.bin", "bin/out.bin", "bin/loop", "wds/inner/x", "wds/y", "away/z", "file/below",
             "top.bin", "absent/deeper/q"]
    root = os.path.realpath(dest)
    resolve = Resolver(root)
    for path in paths:
        assert resolve(path) == os.path.realpath(os.path.join(root, path)), path
    for path, allowed in [("wds/inner/x", True), ("bin/link.bin", True), ("bin/out.bin", False), ("away/z", False)]:
        artifacts = [Artifact(path, "bin", 0, 1, "0" * 64)]
        if allowed:
            check_paths([a.path for a in artifacts], dest, "m")
        else:
            with pytest.raises(InputError, match="resolves outside"):
                check_paths([a.path for a in artifacts], dest, "m")


def test_two_paths_landing_on_one_file_through_a_symlinked_folder_are_refused(tmp_path: Path) -> None:
    """Regression: with DEST/wds a symlink to DEST/bin, `bin/x` and `wds/x` were one file: pull
    wrote both there and reported success with one of them holding the other's bytes."""
    dest = tmp_path / "dest"
    (dest / "bin").mkdir(parents=True)
    (dest / "wds").symlink_to("bin")
    (dest / "bin/y").symlink_to("x")  # a file's own symlink is not followed for this: pull replaces it
    both = [Artifact("bin/x", "bin", 0, 1, "0" * 64), Artifact("wds/x", "wds", 0, 1, "1" * 64)]
    with pytest.raises(InputError, match="'wds/x' lands on the same file as 'bin/x'"):
        check_paths([a.path for a in both], dest, "m")
    check_paths(["bin/x", "bin/y", "wds/z"], dest, "m")


def test_the_pool_keeps_item_order_and_raises_the_first_real_error() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def record(item: int) -> None:
        with lock:
            done.append(item)

    assert run_parallel(lambda item, stop: item * 2, list(range(5000)), 4, record) == [i * 2 for i in range(5000)]
    assert sorted(done) == list(range(5000))

    def fail_on_7(item: int, stop: threading.Event) -> int:
        if item == 7:
            raise ValueError("item 7")
        return item

    started: list[int] = []

    def note_then_fail_on_7(item: int, stop: threading.Event) -> int:
        started.append(item)
        return fail_on_7(item, stop)

    with pytest.raises(ValueError, match="item 7"):
        run_parallel(note_then_fail_on_7, list(range(10_000)), 2)
    assert len(started) < 10_000  # the others stopped early
    assert run_parallel(lambda item, stop: item, [], 8) == []


def test_a_no_op_pull_of_many_artifacts_reads_no_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    snapshot = many_artifacts(store, 3000)
    dest = tmp_path / "dest"
    first = pull(store, snapshot, dest, jobs=4)
    assert (first.files_copied, first.files_reused) == (3000, 0)
    again = pull(store, snapshot, dest)
    assert (again.files_copied, again.files_reused, again.files_rehashed) == (0, 3000, 0)
    assert verify(snapshot, dest, quick=True).ok and verify(snapshot, dest).ok
    shares = partition(artifacts_of(snapshot.manifest), 512)
    assert sorted(a.path for share in shares for a in share.artifacts) == sorted(a["path"] for a in snapshot.artifacts)
