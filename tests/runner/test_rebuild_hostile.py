"""`prep rebuild` attacked where its other tests do not go (issue 43): an input file replaced by a
FIFO, a symlink to /dev/zero, a folder, a copy one byte short or with one byte flipped is one line
naming it, exit 2, and nothing blocks or is stored; a user step that raises under a rebuild is
named with its document as `prep build` names it, and with `on_error = "skip"` the rebuild proves
the id; a carried step source swapped for another valid object is refused, naming it; two
rebuilds of one snapshot at once on one store both prove it and leave the store clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from prep import hashing
from prep.manifest import canonical
from prep.storage import LocalStore
from prep.store import cas
from prep.store.fsck import fsck
from prep.store.layout import object_key
from prep.store.snapshots import Snapshot, resolve
from tests.helpers import make_records, one_error, prep_env, run_prep, user_package, within, write_jsonl, write_pipeline
from tests.runner.test_disk_full import staged
from tests.runner.test_rebuild import built, copied  # noqa: F401  (module fixtures)

Copied = tuple[Path, Snapshot, Path]


def store_files(store: Path) -> list[str]:
    """Every path under a store (files and folders), relative to it."""
    return sorted(str(path.relative_to(store)) for path in store.rglob("*"))


def published(store: Path) -> list[str]:
    """What a build publishes and a rebuild never does: refs and build logs."""
    return [name for name in store_files(store) if name.startswith(("refs", "logs"))]


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _folder(path: Path) -> None:
    path.mkdir()
    (path / "inside.jsonl").write_text("{}\n")


PLANTED: dict[str, Callable[[Path], None]] = {"fifo": _fifo, "dev-zero": _dev_zero, "folder": _folder}


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def _flipped(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


EDITED: dict[str, Callable[[Path], None]] = {"truncated": _truncated, "flipped": _flipped}


def _rebuild_refused(second: Path, snapshot: Snapshot, inputs: Path) -> str:
    """Run a rebuild that must stop at its inputs: its one error line, having checked that it
    exited 2 within seconds and that the store is as it was."""
    before = store_files(second)
    with within(60):
        result = run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, "--workers", "1",
                          check=False, timeout=50)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert store_files(second) == before, "nothing ran, nothing was stored"
    return one_error(result)


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_an_input_replaced_by_a_fifo_a_device_or_a_folder_is_one_line_never_a_block(copied: Copied,  # noqa: F811
                                                                                      planted: str) -> None:
    second, snapshot, inputs = copied
    target = inputs / "more" / "b.jsonl"
    target.unlink()
    PLANTED[planted](target)
    line = _rebuild_refused(second, snapshot, inputs)
    assert f"{target}: input file more/b.jsonl of {snapshot.id}" in line, line
    assert "not a regular file" in line, line


@pytest.mark.parametrize("edit", sorted(EDITED))
def test_an_input_one_byte_short_or_with_one_byte_flipped_is_refused(copied: Copied, edit: str) -> None:  # noqa: F811
    second, snapshot, inputs = copied
    target = inputs / "a.jsonl"
    EDITED[edit](target)
    line = _rebuild_refused(second, snapshot, inputs)
    assert f"{target}: input file a.jsonl differs from the one {snapshot.id} was built from" in line, line
    recorded = next(entry for entry in snapshot.manifest["inputs"]["files"] if entry["path"] == "a.jsonl")
    found = hashing.digest_file(target)
    hashed = "-" if edit == "truncated" else found.sha256[:12]  # a size that differs is not hashed
    assert f"({found.size} bytes, sha256 {hashed}; recorded {recorded['size']} bytes" in line, line


STEPS = '''
import os


def flaky(document):
    """Raise on the document REBUILD_BREAK_ON names: unset when the snapshot was built."""
    if document.id == os.environ.get("REBUILD_BREAK_ON"):
        raise ValueError("broken on purpose")
    return True


def broken(document):
    """Raise on one document, always."""
    if document.id == "doc-7":
        raise ValueError("broken on purpose")
    return True
'''
BREAK_ON = {"REBUILD_BREAK_ON": "doc-7"}


@pytest.fixture(scope="module")
def raising(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Iterator[dict[str, object]]:
    """A store with two snapshots of one user package: `flaky` (its step raises only where
    REBUILD_BREAK_ON is set, which it was not) and `skipping` (its step raises on doc-7, with
    [input] on_error = "skip"); the result of building `flaky` with REBUILD_BREAK_ON set into a
    fresh store; the package is then removed, so rebuilds import only what the store carries."""
    root = tmp_path_factory.mktemp("raising")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(20, seed=5))
    with user_package(root, "raisingsteps", {"rules.py": STEPS}) as name:
        pipelines = {dataset: write_pipeline(root, tokenizer_path, ["corpus"], dataset=dataset, name=f"{dataset}.toml",
                                             extra_input='on_error = "skip"\n' if dataset == "skipping" else "",
                                             extra=f'\n[[steps]]\nuse = "{name}.rules:{step}"\n')
                     for dataset, step in (("flaky", "flaky"), ("skipping", "broken"))}
        ids = {dataset: run_prep("build", pipeline, "--store", root / "store", "--workers", "1").stdout.split()[-1]
               for dataset, pipeline in pipelines.items()}
        failed = run_prep("build", pipelines["flaky"], "--store", root / "fresh", "--workers", "1", check=False,
                          env=prep_env(**BREAK_ON))
        shutil.rmtree(root / name)
    yield {"root": root, "name": name, "ids": ids, "failed": failed}


def test_a_user_step_raising_under_a_rebuild_is_named_with_its_document_as_build_names_it(
        raising: dict[str, object], tmp_path: Path) -> None:
    root, name, ids, failed = raising["root"], raising["name"], raising["ids"], raising["failed"]
    assert isinstance(root, Path) and isinstance(ids, dict) and isinstance(failed, subprocess.CompletedProcess)
    built_line = one_error(failed)
    assert f"step '{name}.rules:flaky' on document 'doc-7': ValueError: broken on purpose" in built_line
    store = tmp_path / "copy"  # no task record: the step runs again
    run_prep("copy", ids["flaky"], "--to", store, "--store", root / "store")
    before = published(store)
    with within(120):
        result = run_prep("rebuild", ids["flaky"], "--inputs", root / "corpus", "--store", store, "--workers", "1",
                          check=False, env=prep_env(**BREAK_ON), timeout=110)
    assert result.returncode == failed.returncode == 2, result.stderr
    assert one_error(result) == built_line, "the same line prep build gives"
    assert result.stdout == "" and published(store) == before


def test_with_on_error_skip_a_user_step_that_raises_rebuilds_to_the_same_id(raising: dict[str, object],
                                                                           tmp_path: Path) -> None:
    root, ids = raising["root"], raising["ids"]
    assert isinstance(root, Path) and isinstance(ids, dict)
    store = LocalStore(root / "store")
    snapshot = resolve(store, ids["skipping"])
    assert snapshot.manifest["stats"]["steps"][0]["reasons"] == {"raised ValueError": 1}
    run_prep("copy", snapshot.id, "--to", tmp_path / "copy", "--store", root / "store")
    report = json.loads(run_prep("rebuild", snapshot.id, "--inputs", root / "corpus", "--store", tmp_path / "copy",
                                 "--workers", "1", "--json").stdout)
    assert report["same"] and report["rebuilt"] == snapshot.id
    assert all(stage["ran"] > 0 for stage in report["stages"]), "every stage ran again, the step raising again"
    assert published(tmp_path / "copy") == []


def _source_entry(snapshot: Snapshot, name: str) -> dict[str, object]:
    """The manifest's step_sources entry of the user package's module file `name`."""
    return next(entry for entry in snapshot.manifest["step_sources"] if entry["path"].endswith(f"/{name}"))


def _object_path(store: Path, object_id: object) -> Path:
    path = LocalStore(store).local_path(object_key(hashing.parse_id(str(object_id))))
    assert path is not None
    return path


def _other_bytes(rules: Path, helpers: Path) -> None:
    rules.chmod(0o644)
    rules.write_bytes(helpers.read_bytes())


def _symlink(rules: Path, helpers: Path) -> None:
    rules.unlink()
    rules.symlink_to(helpers)


def _fifo_at(rules: Path, helpers: Path) -> None:
    rules.unlink()
    os.mkfifo(rules)


SWAPS: dict[str, Callable[[Path, Path], None]] = {"other-object-bytes": _other_bytes, "symlink-to-other-object": _symlink,
                                                  "fifo": _fifo_at}


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_a_step_source_object_replaced_by_another_valid_object_is_refused_naming_it(
        copied: Copied, built: tuple[Path, str], swap: str) -> None:  # noqa: F811
    second, snapshot, inputs = copied
    _, name = built
    rules, helpers = _source_entry(snapshot, "rules.py"), _source_entry(snapshot, "helpers.py")
    SWAPS[swap](_object_path(second, rules["object"]), _object_path(second, helpers["object"]))
    before = store_files(second)
    with within(60):
        result = run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, check=False, timeout=50)
    assert result.returncode == 3, result.stderr
    line = one_error(result)
    assert f"the step source {name}/rules.py of {snapshot.id}: object {rules['object']}" in line, line
    assert ("not a regular file" if swap == "fifo" else "does not hash to its name") in line, line
    assert store_files(second) == before and published(second) == []


def test_a_manifest_naming_another_valid_object_as_a_step_source_is_refused_naming_it(
        copied: Copied, built: tuple[Path, str], tmp_path: Path) -> None:  # noqa: F811
    """The object is sound, its bytes are its name's: only they are not the code the step records."""
    second, snapshot, inputs = copied
    _, name = built
    manifest = json.loads(snapshot.raw)
    entry = next(e for e in manifest["step_sources"] if e["path"].endswith("/rules.py"))
    edited = _object_path(second, entry["object"]).read_bytes().replace(b"< 4", b"< 5")
    entry["object"], entry["bytes"] = cas.put_bytes(LocalStore(second), edited).id, len(edited)
    claimed = tmp_path / "claimed.json"
    claimed.write_bytes(canonical.dumps(manifest))
    with within(60):
        result = run_prep("rebuild", claimed, "--inputs", inputs, "--store", second, check=False, timeout=50)
    assert result.returncode == 1, result.stderr
    line = one_error(result)
    assert f"step {name}.rules:mark: its code here (its carried sources {name}/__init__.py, {name}/helpers.py, " \
           f"{name}/rules.py and" in line, line
    assert not (second / "tasks").exists() and published(second) == [], "nothing was built"


def test_two_rebuilds_of_one_snapshot_at_once_both_prove_it_and_leave_the_store_clean(copied: Copied) -> None:  # noqa: F811
    """In a store holding only the snapshot's objects both run every task, racing to store the
    same task records and objects create-only."""
    second, snapshot, inputs = copied

    def rebuild() -> subprocess.CompletedProcess[str]:
        return run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, "--workers", "1", "--json",
                        check=False, timeout=240)

    with within(300), ThreadPoolExecutor(2) as pool:
        results = [future.result() for future in [pool.submit(rebuild), pool.submit(rebuild)]]
    for result in results:
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["same"] and report["rebuilt"] == snapshot.id
    assert published(second) == [], "neither moved a ref or wrote a log"
    assert staged(second) == [], "nothing left staged"
    report = fsck(LocalStore(second))
    assert report.clean and not report.dangling, (report.findings, report.dangling)


MAGIC_NAMES = ("a[1].jsonl", "all*.jsonl", "~/x.jsonl", "b.jsonl")
"""Input names a glob or a home folder would read otherwise, and one plain name."""
DECOYS = ("a1.jsonl", "all-decoy.jsonl")
"""Files those names match as patterns; `prep rebuild` must read the recorded files, not these."""


def test_inputs_named_like_a_glob_or_a_home_folder_are_read_by_their_names(tmp_path: Path, tokenizer_path: Path) -> None:
    """DIR may hold more than the snapshot's inputs: each recorded name is the file of that name."""
    for index, name in enumerate(MAGIC_NAMES):
        write_jsonl(tmp_path / "corpus" / name, make_records(6, seed=40 + index, prefix=f"m{index}"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    snapshot_id = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1").stdout.split()[-1]
    recorded = resolve(LocalStore(tmp_path / "store"), snapshot_id).manifest["inputs"]["files"]
    assert sorted(entry["path"] for entry in recorded) == sorted(MAGIC_NAMES)
    for index, name in enumerate(DECOYS):
        write_jsonl(tmp_path / "corpus" / name, make_records(3, seed=90 + index, prefix="decoy"))
    home = tmp_path / "home"
    write_jsonl(home / "x.jsonl", make_records(3, seed=99, prefix="decoy"))
    run_prep("copy", snapshot_id, "--to", tmp_path / "copy", "--store", tmp_path / "store")
    result = run_prep("rebuild", snapshot_id, "--inputs", tmp_path / "corpus", "--store", tmp_path / "copy",
                      "--workers", "1", "--json", check=False, env=prep_env(HOME=str(home)))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["same"] and report["rebuilt"] == snapshot_id


@pytest.mark.parametrize("name", ["../outside/a.jsonl", "ABSOLUTE"])
def test_a_manifest_naming_an_input_outside_dir_is_refused_before_reading_it(copied: Copied, tmp_path: Path,  # noqa: F811
                                                                             name: str) -> None:
    """prep records input names relative to the folder that held them all: one that leaves DIR is
    a manifest prep did not write, never a file to hash (even one with the recorded bytes)."""
    second, snapshot, inputs = copied
    outside = tmp_path / "outside" / "a.jsonl"
    outside.parent.mkdir()
    shutil.copyfile(inputs / "a.jsonl", outside)
    name = str(outside) if name == "ABSOLUTE" else name
    manifest = json.loads(snapshot.raw)
    next(entry for entry in manifest["inputs"]["files"] if entry["path"] == "a.jsonl")["path"] = name
    claimed = tmp_path / "claimed.json"
    claimed.write_bytes(canonical.dumps(manifest))
    before = store_files(second)
    result = run_prep("rebuild", claimed, "--inputs", inputs, "--store", second, check=False)
    assert result.returncode == 3, result.stderr
    line = one_error(result)
    assert f"input file path {name!r} is not a relative path inside the folder of its inputs" in line, line
    assert store_files(second) == before
